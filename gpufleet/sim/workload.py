"""One run over one tick: how its GPUs split their time, and what it asks of hosts.

Training runs are synchronous data-parallel: each step lasts as long as the
slowest GPU's compute plus the all-reduce, so a slow GPU makes every peer
wait in the collective (``WAIT``: util stays ~100 %, SM activity and power
drop).  Input starvation makes the starved nodes' GPUs idle outright while
the others wait for them; during a checkpoint rank 0 writes (idle) while
the others wait in the collective; warm-up, checkpoint stalls and evaluation
pauses follow the run's timeline.  Serving runs are steady and lightly loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.sim import states as st
from gpufleet.sim.jobs import JobDemand
from gpufleet.sim.physics import compute_time_factor
from gpufleet.sim.plan import FleetPlan, RunPlan, StarvationPlan

#: Relative per-GPU jitter of a step's compute time (kernels, clocks, data).
STEP_JITTER = 0.008
#: GPUDirect RDMA traffic through PCIe during the all-reduce of a
#: multi-node run, as a share of the link's maximum bandwidth.
RDMA_LINK_SHARE = 0.35
#: NVLink use during the all-reduce, as a share of the maximum.
NVLINK_COMM_SHARE = 0.45
#: Usable share of a PCIe link's payload bandwidth.
PCIE_EFFICIENCY = 0.8
#: Share of a PCIe link's maximum a collective reaches when it crosses PCIe
#: (peer-to-peer through the root complex, or staged in host memory): on a
#: PCIe-only board, or where NVLink cannot be used.
PCIE_COLLECTIVE_SHARE = 0.6
#: Share of a GPU's used memory a checkpoint copies to the host.
CHECKPOINT_STATE_SHARE = 0.5
#: Share of a PCIe link an offloaded optimizer's transfers use each way.
OFFLOAD_LINK_SHARE = 0.5
#: Host CPU (% of all CPUs) and iowait used while a run loads its model.
LOAD_CPU_PCT = 35.0
LOAD_IOWAIT_PCT = 4.0
MIB = 1024.0 * 1024.0


@dataclass
class HostLoad:
    """What the runs on each node asked of it this tick (arrays over nodes)."""

    n: int
    user_pct: np.ndarray = field(init=False)
    system_pct: np.ndarray = field(init=False)
    iowait_pct: np.ndarray = field(init=False)
    disk_read_bytes_s: np.ndarray = field(init=False)
    disk_write_bytes_s: np.ndarray = field(init=False)
    net_rx_bytes_s: np.ndarray = field(init=False)
    net_tx_bytes_s: np.ndarray = field(init=False)
    #: Share of the tick the node's storage was busy writing a checkpoint.
    ckpt_share: np.ndarray = field(init=False)
    #: Starvation in force: the drawn host-side parameters, by node index.
    starving: dict[int, StarvationPlan] = field(default_factory=dict)
    #: What each run asked of each of its nodes (its cgroup there).
    jobs: list[JobDemand] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in (
            "user_pct",
            "system_pct",
            "iowait_pct",
            "disk_read_bytes_s",
            "disk_write_bytes_s",
            "net_rx_bytes_s",
            "net_tx_bytes_s",
            "ckpt_share",
        ):
            setattr(self, name, np.zeros(self.n))


@dataclass
class GpuTick:
    """Per-GPU arrays a tick accumulates while each run is laid out."""

    g: int
    #: Share of the tick in each state, (G, N_STATES).
    frac: np.ndarray = field(init=False)
    pcie_rx_bytes_s: np.ndarray = field(init=False)
    pcie_tx_bytes_s: np.ndarray = field(init=False)
    nvlink_bytes_s: np.ndarray = field(init=False)
    mem_used_mib: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.frac = np.zeros((self.g, st.N_STATES))
        self.pcie_rx_bytes_s = np.zeros(self.g)
        self.pcie_tx_bytes_s = np.zeros(self.g)
        self.nvlink_bytes_s = np.zeros(self.g)
        self.mem_used_mib = np.zeros(self.g)


@dataclass
class RunTickInputs:
    """Fleet-wide state a run's layout depends on."""

    #: SM clock ratio of each GPU while computing (after every limit).
    compute_clock_ratio: np.ndarray
    #: Current over maximum PCIe bandwidth of each GPU's link.
    pcie_bw_ratio: np.ndarray
    #: Current usable PCIe bandwidth, bytes/s.
    pcie_bw_bytes_s: np.ndarray
    pcie_bw_max_bytes_s: np.ndarray
    nvlink_max_bytes_s: np.ndarray
    mem_total_mib: np.ndarray
    #: Standard normal draws, one per GPU, for step jitter.
    jitter: np.ndarray
    #: Usable share of each GPU's NVLink bandwidth (links up, peer access on); None: all of it.
    nvlink_bw_ratio: np.ndarray | None = None


@dataclass
class StepTiming:
    """A training run's step this tick: every GPU's compute time and the step's length."""

    #: Steps completed during the tick (fractional).
    steps: float
    #: Compute time of one step on each of the run's GPUs (``run.gpu_idx`` order), s.
    compute_s: np.ndarray
    comm_s: float
    #: Length of a step: the slowest GPU's compute plus the all-reduce, s.
    step_s: float


def lay_out_run(
    plan: FleetPlan,
    run: RunPlan,
    starvations: list[StarvationPlan],
    a: float,
    b: float,
    inp: RunTickInputs,
    out: GpuTick,
    host: HostLoad,
    node_index: dict[str, int],
    gpu_node: np.ndarray,
) -> StepTiming | None:
    """Fill ``out`` and ``host`` for ``run`` over the tick ``(a, b]``.

    Returns the step timing of a training run (None for serving or when the
    run is not on during the tick).
    """
    dt = b - a
    end = run.end_or(float("inf"))
    f_in = max(0.0, min(b, end) - max(a, run.start)) / dt
    if f_in <= 0.0:
        return None
    idx = run.gpu_idx
    wl = run.workload
    f_load = run.load.covered_in(a, b) / dt
    f_ramp = run.ramp.covered_in(a, b) / dt
    f_ckpt = run.stalls.covered_in(a, b) / dt
    f_eval = run.evals.covered_in(a, b) / dt
    # Input waits: starved GPUs idle, the others of the run wait in the collective.
    starved_idle = np.zeros(idx.shape[0])
    f_starve = 0.0
    for s in starvations:
        w = s.waits.covered_in(a, b) / dt
        if w > 0.0:
            starved_idle += w * np.isin(idx, s.gpu_idx)
            f_starve += w
    f_starve = min(f_starve, 1.0)
    starved_idle = np.minimum(starved_idle, f_starve)
    f_train = max(0.0, f_in - f_load - f_ramp - f_ckpt - f_eval - f_starve)

    frac = out.frac
    frac[idx, st.IDLE] += f_load + starved_idle
    frac[idx, st.WAIT] += f_starve - starved_idle
    # A checkpoint is written by rank 0 while the other ranks spin in the
    # next collective, waiting for it: the blocked-rank signature of real
    # synchronous jobs (writer idle; peers at ~100 % GPU-Util, idle power).
    # A sharded checkpoint (FSDP / distributed checkpointing) has every rank copy its shard out at
    # once: all ranks idle together, each with its own device-to-host burst.
    f_sharded = min(f_ckpt, _sharded_share(plan, run, a, b) / dt)
    if f_ckpt > 0.0:
        frac[idx[:1], st.IDLE] += f_ckpt
        frac[idx[1:], st.WAIT] += f_ckpt - f_sharded
        frac[idx[1:], st.IDLE] += f_sharded
    frac[idx, st.RAMP] += f_ramp
    frac[idx, st.EVAL] += f_eval

    link = inp.pcie_bw_bytes_s[idx]
    n_nodes = len(run.nodes)
    per_node = max(1, idx.shape[0] // n_nodes)
    input_rx = 1.5 * wl.disk_read_bytes_s / per_node
    timing = None
    if wl.kind == "training":
        comm_s = wl.step_s * wl.comm_share / (1.0 - wl.comm_share)
        nvl_rate, pcie_coll, slow = _collective_paths(inp, idx, link)
        comm_s *= slow
        factor = compute_time_factor(
            inp.compute_clock_ratio[idx], wl.mem_bound_share, wl.pcie_share, inp.pcie_bw_ratio[idx]
        )
        compute_s = wl.step_s * factor * (1.0 + STEP_JITTER * inp.jitter[idx])
        step_s = float(compute_s.max()) + comm_s
        c_share, m_share = compute_s / step_s, comm_s / step_s
        frac[idx, st.COMPUTE] += f_train * c_share
        frac[idx, st.COMM] += f_train * m_share
        frac[idx, st.WAIT] += f_train * (1.0 - c_share - m_share)
        timing = StepTiming(f_train * dt / step_s, compute_s, comm_s, step_s)
        rdma = RDMA_LINK_SHARE * inp.pcie_bw_max_bytes_s[idx] if n_nodes > 1 else 0.0
        comm_pcie = np.minimum(rdma + pcie_coll, link)
        out.pcie_rx_bytes_s[idx] += f_train * (c_share * np.minimum(input_rx, link) + m_share * comm_pcie)
        out.pcie_tx_bytes_s[idx] += f_train * (c_share * 0.05 * input_rx + m_share * comm_pcie)
        ratio = _nvlink_ratio(inp, idx)
        out.nvlink_bytes_s[idx] += f_train * (
            m_share * nvl_rate + c_share * 0.01 * inp.nvlink_max_bytes_s[idx] * ratio
        )
    else:
        busy = np.clip(wl.busy_fraction * (1.0 + 0.05 * inp.jitter[idx]), 0.0, 1.0)
        frac[idx, st.COMPUTE] += f_train * busy
        frac[idx, st.IDLE] += f_train * (1.0 - busy)
        out.pcie_rx_bytes_s[idx] += f_train * busy * np.minimum(0.2 * input_rx, link)
        out.pcie_tx_bytes_s[idx] += f_train * busy * np.minimum(0.1 * input_rx, link)

    mem_target = wl.mem_used_fraction * inp.mem_total_mib[idx]
    load_len = run.load.total()
    loaded = 1.0 if load_len <= 0 else min(1.0, max(0.0, (b - run.start) / load_len))
    out.mem_used_mib[idx] = np.where(b > run.start, np.maximum(mem_target * loaded, 500.0), 0.0)
    if f_load > 0 and load_len > 0:
        out.pcie_rx_bytes_s[idx] += f_load * np.minimum(mem_target * MIB / load_len, link)
    if f_ckpt > 0:
        ckpt_rate = (
            CHECKPOINT_STATE_SHARE * mem_target * MIB / max(run.stalls.total() / max(len(run.stalls), 1), 1.0)
        )
        # The writer copies the whole state; a sharded checkpoint has each rank copy its own shard.
        tx = np.minimum(ckpt_rate, link)
        out.pcie_tx_bytes_s[idx[:1]] += f_ckpt * tx[:1]
        out.pcie_tx_bytes_s[idx[1:]] += f_sharded * tx[1:]
    out.pcie_rx_bytes_s[idx] += f_eval * np.minimum(0.5 * input_rx, link)
    # An optimizer offloaded to the host: while the GPUs wait, gradients go out and parameters come
    # back, as much one way as the other.
    offload = sum(s.waits.covered_in(a, b) for s in starvations if s.params.get("offload")) / dt
    if offload > 0:
        moved = np.minimum(OFFLOAD_LINK_SHARE * link, CHECKPOINT_STATE_SHARE * mem_target * MIB / wl.step_s)
        out.pcie_tx_bytes_s[idx] += min(offload, 1.0) * moved
        out.pcie_rx_bytes_s[idx] += min(offload, 1.0) * moved

    _host_side(
        plan,
        run,
        starvations,
        b,
        f_train + f_starve,
        f_load,
        f_ramp,
        f_ckpt,
        f_eval,
        host,
        node_index,
        gpu_node,
    )
    stopped = _idle_and_hung(plan, run, a, b, out)
    if timing is not None and stopped > 0.0:
        timing = StepTiming(timing.steps * (1.0 - stopped), timing.compute_s, timing.comm_s, timing.step_s)
    return timing


def _sharded_share(plan: FleetPlan, run: RunPlan, a: float, b: float) -> float:
    """Seconds of ``(a, b]`` the run spends in sharded checkpoints."""
    return sum(
        c.stalls.covered_in(a, b) for c in plan.checkpoints if c.run_id == run.run_id and c.mode == "sharded"
    )


def _override(out: GpuTick, gpus: np.ndarray, share: float, state: int) -> None:
    """Put ``gpus`` in ``state`` for ``share`` of the tick, whatever the rest of the layout said."""
    if share <= 0.0 or gpus.size == 0:
        return
    keep = 1.0 - share
    out.frac[gpus] *= keep
    out.frac[gpus, state] += share
    out.pcie_rx_bytes_s[gpus] *= keep
    out.pcie_tx_bytes_s[gpus] *= keep
    out.nvlink_bytes_s[gpus] *= keep


def _idle_and_hung(plan: FleetPlan, run: RunPlan, a: float, b: float, out: GpuTick) -> float:
    """Lay idle allocations and hung collectives over the tick; return the share of it in which the
    run made no progress at all (every GPU idle, or stuck in the collective)."""
    dt = b - a
    stopped = 0.0
    for h in plan.hangs:
        if h.run_id != run.run_id:
            continue
        f = min(1.0, max(0.0, min(b, h.end) - max(a, h.start)) / dt)
        if f <= 0.0:
            continue
        spinners = run.gpu_idx[~np.isin(run.gpu_idx, h.dead)]
        _override(out, h.dead, f, st.IDLE)
        _override(out, spinners, f, st.WAIT)
        stopped = max(stopped, f)
    for i in plan.idles:
        if i.run_id != run.run_id:
            continue
        f = min(1.0, max(0.0, min(b, i.end) - max(a, i.start)) / dt)
        if f <= 0.0:
            continue
        _override(out, i.gpu_idx, f, st.IDLE)
        if i.whole_run:
            stopped = max(stopped, f)
    return stopped


def _nvlink_ratio(inp: RunTickInputs, idx: np.ndarray) -> np.ndarray:
    return np.ones(idx.shape[0]) if inp.nvlink_bw_ratio is None else inp.nvlink_bw_ratio[idx]


def _collective_paths(
    inp: RunTickInputs, idx: np.ndarray, link: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per GPU of a training run: NVLink and PCIe rates while in the all-reduce,
    and how much longer the all-reduce takes than on healthy NVLink.

    Every GPU moves the same volume per step and the ring goes at the pace of
    its slowest member: with links down on one GPU every GPU's all-reduce slows
    by the bandwidth lost; where a GPU cannot use NVLink at all its share
    crosses PCIe (and the others wait for it).  Boards without NVLink run
    their collectives over PCIe from the start (their ``comm_share`` says how
    long that takes)."""
    n = idx.shape[0]
    if n <= 1:
        return np.zeros(n), np.zeros(n), 1.0
    nvmax = inp.nvlink_max_bytes_s[idx]
    ratio = _nvlink_ratio(inp, idx)
    has = nvmax > 0
    if not has.any():
        return np.zeros(n), PCIE_COLLECTIVE_SHARE * link, 1.0
    nominal = NVLINK_COMM_SHARE * float(nvmax[has].max())
    usable = has & (ratio > 0)
    # Rate each GPU could sustain: its NVLink share, or PCIe where NVLink is unusable.
    own = np.where(usable, nominal * ratio, PCIE_COLLECTIVE_SHARE * link)
    pace = float(own.min())
    slow = max(1.0, nominal / max(pace, 1.0))
    nvl = np.where(usable, pace, 0.0)
    pcie = np.where(usable, 0.0, pace)
    return nvl, pcie, slow


def _host_side(
    plan: FleetPlan,
    run: RunPlan,
    starvations: list[StarvationPlan],
    b: float,
    f_loader: float,
    f_load: float,
    f_ramp: float,
    f_ckpt: float,
    f_eval: float,
    host: HostLoad,
    node_index: dict[str, int],
    gpu_node: np.ndarray,
) -> None:
    """The run's demands on its nodes.

    ``f_loader`` is the share of the tick the data loader works (training
    plus waits for input): a starved loader reads steadily at the rate the
    GPUs end up consuming (``duty`` of the demand), it does not follow the
    GPUs' sawtooth.
    """
    wl = run.workload
    ckpts = [c for c in plan.checkpoints if c.run_id == run.run_id]
    for name in run.nodes:
        k = node_index[name]
        node = plan.nodes[name]
        share = float(np.count_nonzero(gpu_node[run.gpu_idx] == k)) / len(node.gpu_idx)
        gov = 1.25 if node.cpu_governor == "powersave" else 1.0
        starving = next((s for s in starvations if name in s.nodes and s.start <= b < s.end), None)
        duty = starving.duty if starving is not None else 1.0
        busy = f_loader + 0.5 * f_eval + 0.5 * f_ramp
        if wl.kind == "serving":
            # Requests arrive over the network; the host mostly idles.
            busy, duty = busy * wl.busy_fraction, 0.05
        user = share * (gov * wl.loader_cpu_pct * busy + LOAD_CPU_PCT * f_load)
        system = share * (0.15 * wl.loader_cpu_pct * busy + 6.0 * f_ckpt)
        host.user_pct[k] += user
        host.system_pct[k] += system
        host.jobs.append(
            JobDemand(
                k,
                run.gpu_idx[gpu_node[run.gpu_idx] == k],
                (user + system) / 100.0 * node.cpu_count,
                starving.cause if starving is not None else None,
                starving.params.get("cpu_iowait_pct", 0.0) if starving is not None else 0.0,
                f_ckpt,
            )
        )
        host.iowait_pct[k] += share * LOAD_IOWAIT_PCT * f_load
        host.disk_read_bytes_s[k] += share * (
            wl.disk_read_bytes_s * (duty * f_loader + 0.3 * f_eval)
            + 0.6 * node.disk_read_bytes_s_max * f_load
        )
        for c in ckpts:
            host.disk_write_bytes_s[k] += share * f_ckpt * c.disk_write_bytes_s
            host.net_tx_bytes_s[k] += share * f_ckpt * c.net_tx_bytes_s
        host.ckpt_share[k] = max(host.ckpt_share[k], f_ckpt)
        if starving is not None:
            host.starving[k] = starving
