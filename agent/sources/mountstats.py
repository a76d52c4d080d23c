"""NFS client RPC statistics from ``/proc/<pid>/mountstats``: is the data loader's NFS stalling?

A training job reading its data set over NFS starves its GPUs when the
server or the network falls behind, and the host's own counters barely show
it (a process waiting on an NFS reply is in iowait only on some kernels, and
local disks are idle).  The kernel keeps per-mount RPC counters, the ones
``nfsiostat`` reads:

* ``xprt:`` the transport (``tcp``/``udp``): RPCs sent, and the cumulative
  length of the backlog queue (``bklog_u``) seen at each send, so
  ``bklog_u / sends`` is the mean number of RPCs waiting for a transport slot;
* per-op lines (``READ: ops trans timeouts bytes_sent bytes_recv queue_ms
  rtt_ms execute_ms [errors]``): retransmissions are ``trans - ops``, a major
  timeout is an RPC that waited ``timeo`` (60 s on TCP by default) for a
  reply; ``queue_ms / ops`` is the backlog wait before an RPC was sent,
  ``rtt_ms / ops`` the round trip, ``execute_ms / ops`` the whole request.

Values are cumulative since the mount; :func:`nfs_rates` turns two readings
into the interval's figures, or the since-mount averages when there is only
one.  A counter printed above 2**63 is a kernel's negative number printed
unsigned (seen in real ``mountstats``): that field is unknown, not huge.
Only ``nfs`` and ``nfs4`` mounts are read; ``proc_root`` is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Counters above this are not counts.
_SANE_MAX = 2**62
#: The per-op fields after the op name, in the kernel's order.
OP_FIELDS = (
    "ops",
    "trans",
    "timeouts",
    "bytes_sent",
    "bytes_recv",
    "queue_ms",
    "rtt_ms",
    "execute_ms",
    "errors",
)
#: Position of ``sends`` and ``bklog_u`` among the ``xprt:`` fields after the protocol name.
_XPRT_AT = {"tcp": (5, 9), "udp": (2, 6)}


@dataclass(frozen=True)
class OpStats:
    """One RPC operation's cumulative counters (None where unreadable)."""

    ops: int | None = None
    trans: int | None = None
    timeouts: int | None = None
    bytes_sent: int | None = None
    bytes_recv: int | None = None
    queue_ms: int | None = None
    rtt_ms: int | None = None
    execute_ms: int | None = None
    errors: int | None = None


@dataclass(frozen=True)
class NfsMount:
    """One NFS mount of ``mountstats``."""

    device: str
    mountpoint: str
    fstype: str
    age_s: int | None = None
    proto: str | None = None
    sends: int | None = None
    backlog_u: int | None = None
    ops: dict[str, OpStats] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.device} {self.mountpoint}"

    def total(self, name: str) -> int | None:
        """Sum of field ``name`` over the ops that have it (None when none has)."""
        vals = [getattr(o, name) for o in self.ops.values() if getattr(o, name) is not None]
        return sum(vals) if vals else None


def _count(text: str) -> int | None:
    try:
        v = int(text)
    except ValueError:
        return None
    return v if 0 <= v < _SANE_MAX else None


def parse_mountstats(text: str) -> list[NfsMount]:
    """The NFS (``nfs``, ``nfs4``) mounts of a ``mountstats`` file; other file systems are left out."""
    mounts: list[NfsMount] = []
    cur: dict[str, object] | None = None
    ops: dict[str, OpStats] = {}
    in_ops = False

    def flush() -> None:
        if cur is not None:
            mounts.append(NfsMount(ops=dict(ops), **cur))  # type: ignore[arg-type]

    for raw in text.splitlines():
        line = raw.strip()
        if raw.startswith("device "):
            flush()
            cur, ops, in_ops = None, {}, False
            parts = raw.split()
            # device <dev> mounted on <mountpoint> with fstype <type> [statvers=..]
            try:
                dev, mp, fst = parts[1], parts[4], parts[7]
            except IndexError:
                continue
            if fst in ("nfs", "nfs4"):
                cur = {"device": dev, "mountpoint": mp, "fstype": fst}
            continue
        if cur is None or not line:
            continue
        if line.startswith("age:"):
            cur["age_s"] = _count(line.split()[1]) if len(line.split()) > 1 else None
        elif line.startswith("xprt:"):
            parts = line.split()[1:]
            if parts and parts[0] in _XPRT_AT:
                s_at, b_at = _XPRT_AT[parts[0]]
                vals = parts[1:]
                cur["proto"] = parts[0]
                cur["sends"] = _count(vals[s_at]) if len(vals) > s_at else None
                cur["backlog_u"] = _count(vals[b_at]) if len(vals) > b_at else None
            elif parts:
                cur["proto"] = parts[0]
        elif line.startswith("per-op statistics"):
            in_ops = True
        elif in_ops and ":" in line:
            name, _, rest = line.partition(":")
            vals = rest.split()
            ops[name.strip()] = OpStats(**{f: _count(v) for f, v in zip(OP_FIELDS, vals, strict=False)})
    flush()
    return mounts


def read_mountstats(proc_root: Path | str = "/proc", pid: int | str = "self") -> list[NfsMount]:
    """The NFS mounts seen by ``pid`` (the mount namespace of that process); none when unreadable."""
    try:
        text = (Path(proc_root) / str(pid) / "mountstats").read_text(errors="replace")
    except OSError:
        return []
    return parse_mountstats(text)


@dataclass(frozen=True)
class NfsRates:
    """One mount over an interval (or since it was mounted, ``since_mount``)."""

    mountpoint: str
    device: str
    interval_s: float | None
    since_mount: bool
    ops: int | None
    retrans: int | None
    timeouts: int | None
    errors: int | None
    #: Mean backlog wait before an RPC was sent, ms per op.
    queue_ms: float | None
    rtt_ms: float | None
    execute_ms: float | None
    #: Mean RPCs waiting for a transport slot at each send.
    backlog: float | None
    read_bytes_s: float | None


def _d(a: int | None, b: int | None) -> int | None:
    if a is None or b is None or b < a:
        return None
    return b - a


def nfs_rates(prev: NfsMount | None, curr: NfsMount, interval_s: float | None) -> NfsRates:
    """Figures of ``curr`` since ``prev`` (same mount), else since the mount."""
    since = prev is None or prev.key != curr.key or interval_s is None or interval_s <= 0
    base = NfsMount(curr.device, curr.mountpoint, curr.fstype) if since else prev
    assert base is not None
    names = ("ops", "trans", "timeouts", "errors", "queue_ms", "rtt_ms", "execute_ms", "bytes_recv")
    d = {n: (curr.total(n) if since else _d(base.total(n), curr.total(n))) for n in names}
    ops = d["ops"]
    per_op: dict[str, float | None] = {}
    for n in ("queue_ms", "rtt_ms", "execute_ms"):
        v = d[n]
        per_op[n] = v / ops if ops and v is not None else None
    retrans = d["trans"] - ops if d["trans"] is not None and ops is not None else None
    sends = curr.sends if since else _d(base.sends, curr.sends)
    bklog = curr.backlog_u if since else _d(base.backlog_u, curr.backlog_u)
    span = float(curr.age_s) if since and curr.age_s else (None if since else interval_s)
    return NfsRates(
        mountpoint=curr.mountpoint,
        device=curr.device,
        interval_s=span,
        since_mount=since,
        ops=ops,
        retrans=max(0, retrans) if retrans is not None else None,
        timeouts=d["timeouts"],
        errors=d["errors"],
        queue_ms=per_op["queue_ms"],
        rtt_ms=per_op["rtt_ms"],
        execute_ms=per_op["execute_ms"],
        backlog=bklog / sends if sends and bklog is not None else None,
        read_bytes_s=d["bytes_recv"] / span if d["bytes_recv"] is not None and span else None,
    )
