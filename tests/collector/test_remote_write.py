"""Prometheus remote write into the collector: the agent's rows from the same series, and the HTTP contract.

The reference for every mapping is the agent itself: the same exposition
scraped by the agent's ``dcgm_exporter`` source and attributed by its
attribution step, or the same /proc snapshots read by its host source, must
give the batch that remote-writing them gives, value for value.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet import auth
from gpufleet.agent.attribution import Attributor
from gpufleet.agent.batch import tick_record, to_batch
from gpufleet.agent.sources.dcgm import DCGM_FP64_BLANK, DCGM_INT64_BLANK
from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource
from gpufleet.agent.sources.host import (
    HostSource,
    parse_diskstats,
    parse_net_dev,
    parse_proc_stat,
    read_snapshot,
)
from gpufleet.auth import create_token
from gpufleet.collector.app import create_app
from gpufleet.collector.remote_write_pieces import Piece, map_request
from gpufleet.collector.remote_write_proto import RemoteWriteError, SeriesCache, decode
from gpufleet.collector.remote_write_rows import NodeState, assemble
from gpufleet.collector.remote_write_series import SeriesPlans
from gpufleet.collector.remote_write_store import STAGE_SQL, Assembler, stage_params
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from gpufleet.store.inferred import Inferrer
from gpufleet.wire import Batch, validate
from tests.conftest import realdata
from testsupport import remote_write as rw

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHIPPED = (FIXTURES / "dcgm_exporter" / "shipped_counters_2xh100.prom").read_text()
TARGET = {"instance": "10.0.0.7:9400", "job": "dcgm-exporter"}


def now_ms() -> int:
    return int(time.time() * 1000)


def real_capture() -> str:
    """The 8x H100 dcgm-exporter capture (fenced lines of a markdown file)."""
    text = realdata("dcgm-exporter-output-samples", "accelerator-metrics.md").read_text()
    return "\n".join(line for line in text.splitlines() if line.startswith("DCGM_FI_")) + "\n"


class Pipeline:
    """The collector's remote-write path without HTTP or a database: decode, map, assemble."""

    def __init__(self, node_labels: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")) -> None:
        self.plans = SeriesPlans(node_labels=node_labels)
        self.cache: SeriesCache[int] = SeriesCache(self.plans.plan)
        self.states: dict[str, NodeState] = {}

    def pieces(self, series: list[rw.Series]) -> list[Piece]:
        mapped = map_request(
            decode(rw.write_request(series), self.cache), self.plans, time.time(), 300, 14 * 86400
        )
        return mapped.pieces

    def batches(self, *requests: list[rw.Series]) -> dict[tuple[str, int], Batch]:
        groups: dict[tuple[str, int], list[bytes]] = {}
        for req in requests:
            for p in self.pieces(req):
                groups.setdefault((p.node, p.t_ms), []).append(p.body)
        out = {}
        for (node, t), bodies in sorted(groups.items()):
            b = assemble(node, t, bodies, self.states.setdefault(node, NodeState()))
            assert b is not None
            out[(node, t)] = b
        return out


def agent_batch(text: str, t_ms: int, source: DcgmExporterSource | None = None) -> Batch:
    """The batch the agent ships for one scrape of ``text`` (dcgm_exporter source, attribution)."""
    src = source or DcgmExporterSource("http://unused.invalid/metrics")
    src.scrape = lambda: text  # type: ignore[method-assign]
    rows = src.collect().gpus
    Attributor(use_processes=False).label(rows)
    return validate(to_batch([tick_record(t_ms / 1000.0, rows, None)], "a:1", "n"))


def columns(section: dict[str, Any]) -> dict[str, list[Any]]:
    """A batch section as {column: values}, leaving out columns that are NULL throughout."""
    out = {}
    for name, col in section.items():
        values = col.tolist()
        if any(v is not None for v in values):
            out[name] = values
    return out


def by_gpu(cols: dict[str, list[Any]]) -> dict[tuple[Any, Any], dict[str, Any]]:
    n = len(cols["gpu"])
    rows = {
        (cols["gpu"][i], cols.get("mig_instance", [None] * n)[i]): {k: v[i] for k, v in cols.items()}
        for i in range(n)
    }
    return rows


def assert_same_rows(remote: Batch, agent: Batch) -> None:
    r, a = by_gpu(columns(remote.gpu)), by_gpu(columns(agent.gpu))
    assert set(r) == set(a)
    for key in a:
        ra = {k: v for k, v in r[key].items() if v is not None}
        aa = {k: v for k, v in a[key].items() if v is not None}
        assert ra == aa, (key, set(ra.items()) ^ set(aa.items()))


# ------------------------------------------------------------------ the agent's rows, from remote write


@pytest.mark.parametrize("text", [SHIPPED, real_capture()], ids=["shipped-counters", "real-8xH100"])
def test_a_scrape_remote_written_is_the_agents_batch(text: str) -> None:
    t = now_ms()
    (batch,) = Pipeline().batches(rw.from_exposition(text, t, TARGET)).values()
    agent = agent_batch(text, t)
    assert_same_rows(batch, agent)
    assert batch.node == "gpu-node-7" if text is SHIPPED else batch.node == "gpu-node-1"
    assert batch.batch_id == f"rw:{t}"
    if text is SHIPPED:
        runs = columns(batch.gpu)["run_id"]
        assert runs == ["ml-research:llm-pretrain-master-0", "ml-research:llm-pretrain-worker-0"]
        assert batch.facts is not None and set(batch.facts["runs"]) == set(runs)
        assert batch.facts["runs"][runs[0]]["team"] == "ml-research"
        assert [g["name"] for g in batch.facts["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2


LABELS = (
    'gpu="0",UUID="GPU-a",pci_bus_id="00000000:53:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
    'Hostname="n1"'
)


def series(name: str, value: object, extra: str = "") -> str:
    return f"{name}{{{LABELS}{extra}}} {value}"


def mig(gi: int, pod: str | None = None) -> str:
    return f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi}"' + (f',namespace="team-a",pod="{pod}"' if pod else "")


def test_mig_instances_blanks_priorities_and_framebuffer_total_as_the_agent() -> None:
    text = (
        "\n".join(
            [
                series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(2, "p2")),
                series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(9, "p9")),
                series("DCGM_FI_DEV_POWER_USAGE", 432.21, mig(2, "p2")),
                series("DCGM_FI_PROF_SM_ACTIVE", 0.91, mig(2, "p2")),
                series("DCGM_FI_PROF_SM_ACTIVE", 0.05, mig(9, "p9")),
                series("DCGM_FI_DEV_FB_USED", 11091, mig(2, "p2")),
                series("DCGM_FI_DEV_FB_USED", 30000),
                series("DCGM_FI_DEV_FB_FREE", 50000),
                series("DCGM_FI_DEV_FB_RESERVED", 559),
                series("DCGM_FI_DEV_MEMORY_TEMP", DCGM_INT64_BLANK + 2),
                series("DCGM_FI_DEV_GPU_TEMP", 61),
                series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", DCGM_FP64_BLANK),
                series("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 9139),  # KB/s, the fallback
                series("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 19191),
                series("DCGM_FI_PROF_PCIE_RX_BYTES", 20_000_000),  # bytes/s, preferred
                series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 4),
                series("dcgm_sm_clock", 1980),
            ]
        )
        + "\n"
    )
    t = now_ms()
    (batch,) = Pipeline().batches(rw.from_exposition(text, t)).values()
    assert_same_rows(batch, agent_batch(text, t))
    rows = by_gpu(columns(batch.gpu))
    assert rows[(0, None)]["mem_total_mib"] == 30000 + 50000 + 559
    assert (
        rows[(0, None)]["pcie_rx_bytes_s"] == 20_000_000 and rows[(0, None)]["pcie_tx_bytes_s"] == 9139 * 1024
    )
    assert rows[(0, 2)]["run_id"] == "team-a:p2" and rows[(0, 9)]["run_id"] == "team-a:p9"
    assert [r.get("energy_mj") for r in rows.values()].count(123456789012) == 1


def test_xid_gauge_changes_and_window_counts_as_the_agent() -> None:
    pipe = Pipeline()
    src = DcgmExporterSource("http://unused.invalid/metrics")
    t = now_ms()
    scrapes = [
        series("DCGM_FI_DEV_XID_ERRORS", 0),
        series("DCGM_FI_DEV_XID_ERRORS", 79),
        series("DCGM_FI_DEV_XID_ERRORS", 79),
        series("DCGM_FI_DEV_XID_ERRORS", 13),
        "\n".join(
            [
                series("DCGM_FI_DEV_XID_ERRORS", 13),
                series("DCGM_EXP_XID_ERRORS_COUNT", 2, ',xid="48"'),
                series("DCGM_EXP_XID_ERRORS_COUNT", 1, ',xid="13"'),
            ]
        ),
    ]
    seen = []
    for i, text in enumerate(scrapes):
        text += "\n"
        (batch,) = pipe.batches(rw.from_exposition(text, t + 1000 * i)).values()
        assert_same_rows(batch, agent_batch(text, t + 1000 * i, src))
        seen.append(batch.gpu["xid"].tolist()[0])
    assert seen == [0, 79, 0, 13, 48]


def test_a_scrape_split_over_requests_in_any_order_is_one_row_per_gpu() -> None:
    t = now_ms()
    scrape = rw.from_exposition(SHIPPED, t, TARGET)
    whole = Pipeline().batches(scrape)
    rnd = random.Random(7)
    for _ in range(5):
        shuffled = scrape[:]
        rnd.shuffle(shuffled)
        cuts = sorted(rnd.sample(range(1, len(shuffled)), 3))
        parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
        split = Pipeline().batches(*parts)
        assert split.keys() == whole.keys()
        for key, b in split.items():
            assert columns(b.gpu) == columns(whole[key].gpu)
            assert b.n_gpu == 2


def test_samples_of_several_nodes_and_times_in_one_request_are_one_batch_each() -> None:
    t = now_ms()
    req = []
    for node in ("gpu-a", "gpu-b"):
        for k in range(3):
            req += rw.from_exposition(SHIPPED.replace("gpu-node-7", node), t + 15000 * k, TARGET)
    batches = Pipeline().batches(req)
    assert sorted(batches) == [(n, t + 15000 * k) for n in ("gpu-a", "gpu-b") for k in range(3)]
    assert all(b.n_gpu == 2 for b in batches.values())


def proc_as_node_exporter(root: Path, t_ms: int) -> list[rw.Series]:
    """A /proc snapshot as node_exporter exports it (seconds, bytes), every device and interface."""
    out: list[rw.Series] = []
    base = {"instance": "gpu-node-7:9100", "job": "node"}

    def add(name: str, value: float, **labels: str) -> None:
        out.append(({"__name__": name, **base, **labels}, [(value, t_ms)]))

    for n, c in parse_proc_stat((root / "stat").read_text()).items():
        for mode in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"):
            add("node_cpu_seconds_total", getattr(c, mode) / 100.0, cpu=str(n), mode=mode)
        add("node_cpu_guest_seconds_total", c.guest / 100.0, cpu=str(n), mode="user")
        add("node_cpu_guest_seconds_total", c.guest_nice / 100.0, cpu=str(n), mode="nice")
    for dev, d in parse_diskstats((root / "diskstats").read_text()).items():
        add("node_disk_reads_completed_total", d.rd_ios, device=dev)
        add("node_disk_read_bytes_total", d.rd_sectors * 512.0, device=dev)
        add("node_disk_read_time_seconds_total", d.rd_ticks_ms / 1000.0, device=dev)
        add("node_disk_writes_completed_total", d.wr_ios, device=dev)
        add("node_disk_written_bytes_total", d.wr_sectors * 512.0, device=dev)
        add("node_disk_write_time_seconds_total", d.wr_ticks_ms / 1000.0, device=dev)
        add("node_disk_io_time_seconds_total", d.io_ticks_ms / 1000.0, device=dev)
        add("node_disk_io_now", 0, device=dev)  # not read: counted as unused
    for nic, c in parse_net_dev((root / "net" / "dev").read_text()).items():
        add("node_network_receive_bytes_total", c.rx_bytes, device=nic)
        add("node_network_receive_packets_total", c.rx_packets, device=nic)
        add("node_network_transmit_bytes_total", c.tx_bytes, device=nic)
        add("node_network_transmit_packets_total", c.tx_packets, device=nic)
        add("node_network_receive_errs_total", c.rx_errs, device=nic)
        add("node_network_receive_drop_total", c.rx_drop, device=nic)
        add("node_network_transmit_errs_total", c.tx_errs, device=nic)
        add("node_network_transmit_drop_total", c.tx_drop, device=nic)
    return out


def test_node_exporter_counters_give_the_agents_host_rates() -> None:
    """sysstat's five recorded /proc snapshots, read by the agent's host source and remote-written
    as node_exporter exports them: the same host rows (and so sysstat's own figures)."""
    pipe = Pipeline()
    agent = HostSource(sys_root=None, rapl=False)
    uptime_5 = read_snapshot(realdata("sysstat", "root5", "proc"), None, rapl=False).uptime_s
    base_ms = now_ms() - round(uptime_5 * 1000) - 60_000
    for i in range(1, 6):
        root = realdata("sysstat", f"root{i}", "proc")
        snap = read_snapshot(root, None, rapl=False, fabric=False)
        expected = agent.update(dataclasses.replace(snap, ib={}))
        t_ms = base_ms + round(snap.uptime_s * 1000)
        (batch,) = pipe.batches(proc_as_node_exporter(root, t_ms)).values()
        got = {k: v[0] for k, v in columns(batch.host).items() if k != "time"}
        want = {k: v for k, v in expected.items() if v is not None and not k.startswith("ib_")}
        assert got.keys() == want.keys(), (i, got.keys() ^ want.keys())
        for k, v in want.items():
            # The interval is a difference of absolute times (ms since the epoch, as seconds): 1e-7 s of
            # float resolution, where the agent subtracts uptimes.
            assert got[k] == pytest.approx(v, rel=1e-6), (i, k)
        if i > 1:
            assert got["cpu_idle_pct"] is not None and "disk_util_pct" in got and "net_rx_bytes_s" in got


def test_a_value_the_catalog_refuses_refuses_the_request_naming_it() -> None:
    pipe = Pipeline()
    bad = rw.from_exposition(series("DCGM_FI_DEV_GPU_UTIL", 250) + "\n", now_ms())
    with pytest.raises(
        RemoteWriteError, match=r"DCGM_FI_DEV_GPU_UTIL\{.*gpu=\"0\".*250.* util_pct .*\[0, 100\]"
    ):
        pipe.pieces(rw.from_exposition(SHIPPED, now_ms()) + bad)
    with pytest.raises(RemoteWriteError, match="not a number"):
        pipe.pieces(
            [({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n"}, [(float("inf"), now_ms())])]
        )


def test_what_is_not_used_is_counted_by_reason() -> None:
    pipe = Pipeline()
    stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
    t = now_ms()
    req = [
        ({"__name__": "up", "instance": "a:1"}, [(1.0, t)]),
        ({"__name__": "go_goroutines", "instance": "a:1"}, [(12.0, t)]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, [(50.0, t)]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "n"}, [(50.0, t)]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "n", "gpu": "0"}, [(stale, t), (50.0, t - 10**9)]),
    ]
    mapped = map_request(decode(rw.write_request(req), pipe.cache), pipe.plans, time.time(), 300, 86400)
    assert mapped.dropped == {"unused": 2, "no_node": 1, "no_gpu": 1, "stale": 1}
    assert mapped.skewed == {"n": 1}
    assert mapped.pieces == []


def test_the_node_is_the_first_node_label_and_instance_loses_its_port() -> None:
    t = now_ms()
    temp = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}
    pipe = Pipeline()
    got = pipe.pieces(
        [
            ({**temp, "instance": "host-1:9400"}, [(50.0, t)]),
            ({**temp, "instance": "10.1.2.3:9400", "Hostname": "gpu-b"}, [(50.0, t)]),
            ({**temp, "instance": "x:9400", "Hostname": "gpu-b", "node": "k8s-node-3"}, [(50.0, t)]),
        ]
    )
    assert sorted(p.node for p in got) == ["gpu-b", "host-1", "k8s-node-3"]
    req = [({**temp, "instance": "[fd00::1]:9400"}, [(50.0, t)]), ({**temp, "Hostname": "a b"}, [(50.0, t)])]
    mapped = map_request(decode(rw.write_request(req), pipe.cache), pipe.plans, time.time(), 300, 86400)
    assert mapped.pieces == [] and mapped.dropped == {"bad_node": 2}


# ------------------------------------------------------------------ stored through the database


def stage(conn: psycopg.Connection, pieces: list[Piece]) -> None:
    conn.execute(STAGE_SQL, stage_params(pieces))


def test_groups_are_stored_once_retries_and_late_pieces_are_counted(db: str) -> None:
    pipe = Pipeline()
    t = now_ms()
    scrape = rw.from_exposition(SHIPPED, t, TARGET)
    asm = Assembler(db, merge_delay_s=0.0, every_s=1.0)
    with psycopg.connect(db, autocommit=True) as conn:
        stage(conn, pipe.pieces(scrape[:40]))
        stage(conn, pipe.pieces(scrape[40:]))
        stage(conn, pipe.pieces(scrape[40:]))  # a retried request, before assembly
        done = asm.cycle(conn)
        assert (done.groups, done.stored, done.gpu_rows) == (1, 1, 2)
        rows = conn.execute(
            "SELECT gpu, util_pct, energy_mj, run_id, uuid FROM gpu_samples "
            "WHERE node = 'gpu-node-7' ORDER BY gpu"
        ).fetchall()
        assert rows == [
            (
                0,
                97.0,
                8123456789,
                "ml-research:llm-pretrain-master-0",
                "GPU-5e3b8c1a-7d2f-4a96-b1c0-3f8e2d9a4b71",
            ),
            (
                1,
                100.0,
                8412097310,
                "ml-research:llm-pretrain-worker-0",
                "GPU-a91c2e47-0b6d-4f38-9e25-c7d4b8f1e063",
            ),
        ]
        stage(conn, pipe.pieces(scrape))  # retried after it was stored
        done = asm.cycle(conn)
        assert (done.groups, done.stored, done.duplicates) == (1, 0, 1)
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM remote_write_parts").fetchone() == (0,)
        facts = conn.execute("SELECT facts FROM nodes WHERE node = 'gpu-node-7'").fetchone()[0]  # type: ignore[index]
        assert facts["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
        # The runs the pods name are inferred, with the team their namespace gives.
        Inferrer(300.0).run_once(conn, datetime.now(UTC))
        runs = conn.execute("SELECT run_id, source, team FROM runs ORDER BY run_id").fetchall()
        assert runs == [
            ("ml-research:llm-pretrain-master-0", "inferred", "ml-research"),
            ("ml-research:llm-pretrain-worker-0", "inferred", "ml-research"),
        ]


def test_a_group_waits_for_the_merge_delay_after_its_last_piece(db: str) -> None:
    pipe = Pipeline()
    t = now_ms()
    scrape = rw.from_exposition(SHIPPED, t, TARGET)
    asm = Assembler(db, merge_delay_s=2.0, every_s=1.0)
    with psycopg.connect(db, autocommit=True) as conn:
        stage(conn, pipe.pieces(scrape[:40]))
        assert asm.cycle(conn).groups == 0
        time.sleep(1.2)
        stage(conn, pipe.pieces(scrape[40:]))
        time.sleep(1.2)
        assert asm.cycle(conn).groups == 0  # the first piece is old enough, the last is not
        time.sleep(1.0)
        done = asm.cycle(conn)
        assert (done.groups, done.stored) == (1, 1)
        assert conn.execute("SELECT count(*), count(power_w), count(temp_c) FROM gpu_samples").fetchone() == (
            2,
            2,
            2,
        )


# ------------------------------------------------------------------ over HTTP


@dataclass
class RW:
    url: str
    db: str
    tokens: dict[str, str]

    def post(self, raw: bytes, who: str = "prom", **headers: str) -> httpx.Response:
        h = {**rw.HEADERS, **headers}
        if who:
            h["Authorization"] = f"Bearer {self.tokens[who]}"
        return httpx.post(
            f"{self.url}/api/v1/write",
            content=rw.compress(raw) if headers.get("raw") is None else raw,
            headers={k: v for k, v in h.items() if k != "raw"},
            timeout=30,
        )

    def wait_rows(self, n: int, table: str = "gpu_samples", timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.db) as conn:
                got = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
            if got >= n:
                return
            time.sleep(0.1)
        raise AssertionError(f"{table}: {got} rows, not {n}")


@pytest.fixture
def rwc(db: str, settings: Settings) -> Iterator[RW]:
    s = settings.model_copy(
        update={
            "remote_write": settings.remote_write.model_copy(
                update={"merge_delay_s": 0.3, "assemble_every_s": 0.1}
            )
        }
    )
    with psycopg.connect(db, autocommit=True) as c:
        tokens = {
            "prom": create_token(c, "prom", "remote_write"),
            "node-a": create_token(c, "node-a", "node", "node-a"),
            "sre": create_token(c, "sre", "sre"),
            "admin": create_token(c, "admin", "admin"),
        }
    app = create_app(db, s, run_leader=False)
    with serve(app, **server_options(s)) as srv:
        yield RW(srv.url, db, tokens)


def metric(url: str, name: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_remote_write_asks_for_its_capability(rwc: RW, monkeypatch: pytest.MonkeyPatch) -> None:
    """The role is refused as soon as gpufleet.auth's table takes remote_write from it."""
    raw = rw.write_request(rw.from_exposition(SHIPPED, now_ms(), TARGET))
    monkeypatch.setitem(auth.CAPABILITIES, "remote_write", frozenset())
    r = rwc.post(raw)
    assert r.status_code == 403
    assert r.json()["detail"] == "role 'remote_write' may not remote-write; use a token of role remote_write"


def test_remote_write_over_http_stores_rows_and_only_its_role_may(rwc: RW) -> None:
    raw = rw.write_request(
        [
            *rw.from_exposition(SHIPPED, now_ms(), TARGET),
            ({"__name__": "up", "instance": "x:1"}, [(1.0, now_ms())]),
        ]
    )
    assert rwc.post(raw, who="").status_code == 401
    for who in ("node-a", "sre", "admin"):
        r = rwc.post(raw, who=who)
        assert r.status_code == 403 and "remote_write" in r.json()["detail"], who
    r = rwc.post(raw)
    assert r.status_code == 204, r.text
    rwc.wait_rows(2)
    m = metric(rwc.url, "gpufleet_remote_write")
    assert m['gpufleet_remote_write_requests_total{code="204"}'] == 1
    assert m['gpufleet_remote_write_requests_total{code="403"}'] == 3
    assert m['gpufleet_remote_write_dropped_samples_total{reason="unused"}'] == 1
    assert m['gpufleet_remote_write_samples_total{kind="gpu"}'] == 78


def test_malformed_requests_are_400_and_store_nothing(rwc: RW) -> None:
    good = rw.from_exposition(SHIPPED, now_ms(), TARGET)
    bad_value = [
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "gpu-node-7"}, [(900.0, now_ms())])
    ]
    for raw, status, reason in [
        (rw.write_request(good + bad_value), 400, "outside"),
        (rw.write_request(good)[:-3], 400, ""),
        (b"\x0a\x80", 400, "truncated"),
    ]:
        r = rwc.post(raw)
        assert r.status_code == status and reason in r.json()["detail"], r.text
        assert "nothing of this request was stored" in r.json()["detail"]
    r = httpx.post(
        f"{rwc.url}/api/v1/write",
        content=b"not snappy",
        timeout=10,
        headers={**rw.HEADERS, "Authorization": f"Bearer {rwc.tokens['prom']}"},
    )
    assert r.status_code == 400 and "snappy" in r.json()["detail"]
    for headers, detail in [
        ({"Content-Encoding": "gzip"}, "snappy"),
        ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, "1.0"),
        ({"Content-Type": "application/json"}, "x-protobuf"),
    ]:
        r = httpx.post(
            f"{rwc.url}/api/v1/write",
            content=rw.compress(rw.write_request(good)),
            timeout=10,
            headers={**rw.HEADERS, **headers, "Authorization": f"Bearer {rwc.tokens['prom']}"},
        )
        assert r.status_code == 415 and detail in r.json()["detail"], r.text
    time.sleep(0.8)
    with psycopg.connect(rwc.db) as conn:
        assert conn.execute(
            "SELECT (SELECT count(*) FROM gpu_samples), (SELECT count(*) FROM remote_write_parts)"
        ).fetchone() == (0, 0)


def test_a_body_over_the_limit_is_413(rwc: RW, settings: Settings) -> None:
    big = b"\x00" * (settings.ingest.max_body_bytes + 1)
    r = httpx.post(
        f"{rwc.url}/api/v1/write",
        content=big,
        timeout=30,
        headers={**rw.HEADERS, "Authorization": f"Bearer {rwc.tokens['prom']}"},
    )
    assert r.status_code == 413


def test_the_ingest_bounds_of_an_agents_batch_hold() -> None:
    t = now_ms()
    pipe = Pipeline()
    pipe.plans.max_gpu_index = 7
    with pytest.raises(RemoteWriteError, match=r"GPU index 8 is above .* \(ingest.max_gpu_index\)"):
        pipe.pieces([({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "8", "Hostname": "n"}, [(50.0, t)])])
    many = [
        (
            {
                "__name__": "DCGM_FI_DEV_GPU_TEMP",
                "gpu": "0",
                "Hostname": "n",
                "namespace": "ns",
                "pod": f"p{i}",
                "GPU_I_ID": str(i),
            },
            [(50.0, t)],
        )
        for i in range(4)
    ]
    mapped = map_request(
        decode(rw.write_request(many), pipe.cache), pipe.plans, time.time(), 300, 86400, max_runs=4
    )
    assert len(mapped.pieces) == 1
    with pytest.raises(RemoteWriteError, match=r"names 4 runs; a batch may name at most 3"):
        map_request(
            decode(rw.write_request(many), pipe.cache), pipe.plans, time.time(), 300, 86400, max_runs=3
        )
