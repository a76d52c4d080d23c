"""Every benchmark and tool script still loads: nothing else imports them, so a moved name would go unseen."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: tools/gen_podresources.py takes no options (it rewrites the generated modules; its own test runs it).
#: bench/__init__.py and bench/common.py are the package and its shared helpers, not scripts.
SCRIPTS = sorted(
    [
        *(p for p in ROOT.glob("bench/*.py") if p.name not in ("__init__.py", "common.py")),
        ROOT / "tools" / "record_gpu_traces.py",
    ]
)


def bench_module(name: str) -> Any:
    """A bench script imported as the module its siblings import (``bench.<name>``), not a second copy."""
    return importlib.import_module("bench." + name)


def test_there_are_scripts() -> None:
    assert {p.name for p in SCRIPTS} >= {"sweep.py", "ingest.py", "detector_quality.py", "vs_prometheus.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_answers_help(script: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage" in res.stdout.lower()


def test_request_cpu_times_both_validation_paths_on_the_same_requests() -> None:
    res = subprocess.run(
        [sys.executable, "bench/request_cpu.py", "--requests", "20", "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last["name"] == "request_cpu_validate" and last["requests"] == 20
    assert last["gpu_samples_per_request"] == 80
    assert last["value"] > 0 and last["baseline_column_by_column"] > 0
    assert last["encode"] > 0 and last["encode_column_by_column"] > 0
    assert min(last["wait"], last["wait_for_shield"], last["answer"], last["answer_json_response"]) > 0


@pytest.mark.serial  # WAL is written server-wide: other workers' writes would count as its own
def test_pg_rows_measures_every_variant_on_the_same_rows() -> None:
    res = subprocess.run(
        [sys.executable, "bench/pg_rows.py", "--nodes", "20", "--seconds", "10", "--variants"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last["name"] == "pg_rows"
    variants = last["variants"]
    assert set(variants) == {
        "as_migrated",
        "no_btree",
        "btree_without_deduplication",
        "node_collated_c",
        "rows_sorted_by_gpu",
        "no_brin",
        "no_indexes",
    }
    assert {v["rows"] for v in variants.values()} == {20 * 8 * 10}
    # Backend CPU is read in 10-ms ticks, which rows this few may not reach; WAL is exact.
    assert all(v["backend_us_per_row"] >= 0 and v["wal_bytes_per_row"] > 0 for v in variants.values())
    # Without the btree each row writes less WAL: its index entries are gone.
    assert variants["no_btree"]["wal_bytes_per_row"] < variants["as_migrated"]["wal_bytes_per_row"]
    assert variants["no_indexes"]["stored_bytes_per_row"] < variants["no_btree"]["stored_bytes_per_row"]


@pytest.mark.serial  # WAL is written server-wide: other workers' writes would count as its own
def test_pg_rows_shipment_layouts_store_every_sample() -> None:
    """Both shipment layouts hold every GPU-sample of the same batches, and the bytes
    layout each sample's values exactly as the sample table does."""
    res = subprocess.run(
        [sys.executable, "bench/pg_rows.py", "--nodes", "20", "--seconds", "10", "--shipment-rows"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    variants = json.loads(res.stdout.strip().splitlines()[-1])["variants"]
    assert set(variants) == {
        "as_migrated",
        "no_btree",
        "one_row_per_gpu_shipment",
        "one_row_per_gpu_shipment_as_bytes",
    }
    assert {v["rows"] for v in variants.values()} == {20 * 8 * 10}
    # A row per ten samples: less WAL per sample than a row per sample, and the bytes less again.
    arrays, raw = variants["one_row_per_gpu_shipment"], variants["one_row_per_gpu_shipment_as_bytes"]
    assert (
        raw["wal_bytes_per_row"] < arrays["wal_bytes_per_row"] < variants["as_migrated"]["wal_bytes_per_row"]
    )


def test_shipment_rows_hold_each_gpus_values_in_time_order() -> None:
    pg_rows = bench_module("pg_rows")
    b = pg_rows.batches(1, 10)[0]
    fields = pg_rows.shipment_fields(b)
    assert {sp.name for sp in fields} == set(b.gpu) - {"time", "gpu", "uuid"}
    gpu, t = b.gpu["gpu"].values, b.gpu["time"].values
    for as_bytes in (False, True):
        rows = pg_rows.shipment_rows(b, fields, as_bytes)
        assert [r[2] for r in rows] == sorted(set(gpu.tolist()))
        for row in rows:
            idx = np.flatnonzero(gpu == row[2])
            idx = idx[np.argsort(t[idx])]
            assert row[3] == [round((t[i] - t[idx[0]]) * 1000) for i in idx.tolist()]
            for sp, got in zip(fields, row[6:], strict=True):
                want = b.gpu[sp.name].values[idx]
                if as_bytes:
                    got = np.frombuffer(got, dtype=pg_rows._LITTLE_ENDIAN[sp.pgtype])
                    assert np.array_equal(got, want.astype(got.dtype)), sp.name
                else:
                    assert got == want.tolist(), sp.name


def test_every_layout_reads_back_the_same_minute_averages() -> None:
    """The rollups' read of each layout (SQL over rows, SQL over unnested arrays, numpy over
    fetched bytes) gives every (node, GPU, minute) the averages of the batches' values, NULLs left out."""
    import dataclasses

    import psycopg

    from gpufleet.collector.batch_store import write_batches
    from gpufleet.config import load_settings
    from gpufleet.db import migrate
    from gpufleet.db.scratch import scratch_database
    from gpufleet.wire import Column
    from testsupport.pg import server_url

    pg_rows = bench_module("pg_rows")
    todo = pg_rows.batches(3, 130)  # 10-s batches over three minutes or so
    fields = pg_rows.shipment_fields(todo[0])
    # Shifted so that each node's 10-s shipments straddle the minutes' edges: a sample goes to its
    # own minute, not to its shipment's.
    shift = (55.0 - todo[0].gpu["time"].values.min() % 60) % 60
    # NULLs: every third power reading of every batch, and the first node's GPU 0's utilisation
    # throughout the first batch's minute (an average over no value is NULL, not 0).
    minute0 = (todo[0].gpu["time"].values.min() + shift) // 60
    for i, b in enumerate(todo):
        gpu, t = b.gpu["gpu"].values, b.gpu["time"].values + shift
        cols = dict(b.gpu)
        cols["time"] = Column(t)
        cols["power_w"] = Column(cols["power_w"].values, np.arange(len(gpu)) % 3 == 0)
        if b.node == todo[0].node:
            cols["util_pct"] = Column(cols["util_pct"].values, (gpu == 0) & (t // 60 == minute0))
        todo[i] = dataclasses.replace(b, gpu=cols, span=None)
    # The oracle: each (node, GPU, minute)'s mean of the values not NULL, from the batches themselves.
    names = [sp.name for sp in fields]
    want: dict[tuple[str, int, int], dict[str, list[float]]] = {}
    for b in todo:
        for j in range(b.n_gpu):
            key = (b.node, int(b.gpu["gpu"].values[j]), int(b.gpu["time"].values[j] // 60 * 60))
            per = want.setdefault(key, {n: [] for n in names})
            for n in names:
                col = b.gpu[n]
                if col.null is None or not col.null[j]:
                    per[n].append(float(col.values[j]))
    got = {}
    with scratch_database(server_url(), "gpufleet_pgrows_read") as url:
        migrate.upgrade(url, load_settings())
        with psycopg.connect(url, autocommit=True) as conn:
            write_batches(conn, todo)
            got["rows"] = pg_rows.minute_averages(conn, "as_migrated", fields)
            for variant in pg_rows.SHIPMENTS:
                as_bytes = variant == pg_rows.SHIPMENT_BYTES
                conn.execute("DROP TABLE IF EXISTS gpu_shipments")
                pg_rows.create_shipment_table(conn, fields, as_bytes)
                pg_rows.copy_shipments(
                    conn,
                    [r for b in todo for r in pg_rows.shipment_rows(b, fields, as_bytes)],
                    fields,
                    as_bytes,
                )
                got[variant] = pg_rows.minute_averages(conn, variant, fields)
    assert len(want) >= 3 * 8 * 3
    assert any(len({int(t // 60) for t in b.gpu["time"].values}) == 2 for b in todo)
    # The sample table keeps some fields to fewer mantissa bits (``Spec.bits``); the shipment layouts
    # here keep every float4 whole.
    rtol = np.array([2.0**-sp.bits if sp.bits else 1e-6 for sp in fields])
    p, u = names.index("power_w"), names.index("util_pct")
    for layout, averages in got.items():
        assert set(averages) == set(want), layout
        for key, per in want.items():
            for j in (p, u):
                values = per[names[j]]
                if not values:
                    assert np.isnan(averages[key][j]), (layout, key, names[j])
                else:
                    assert averages[key][j] == pytest.approx(np.mean(values), rel=max(rtol[j], 1e-5)), (
                        layout,
                        key,
                        names[j],
                    )
        for key in want:  # and every other field alike on every layout, to the rows' stored precision
            assert np.allclose(averages[key], got["rows"][key], rtol=rtol, atol=0, equal_nan=True), (
                layout,
                key,
            )
    assert sum(np.isnan(v[u]) for v in got["rows"].values()) == 1


def test_vs_prometheus_prints_no_figure_per_sample_where_no_sample_landed() -> None:
    vs_prometheus = bench_module("vs_prometheus")
    assert vs_prometheus.per_sample(3.0, 2) == 1.5
    step = vs_prometheus.Step(112_000)
    step.cpu_us_per_gpu_sample = vs_prometheus.per_sample(1.3, 0) * 1e6
    step.bytes_per_gpu_sample = vs_prometheus.per_sample(4096, 0)
    assert vs_prometheus.none_if_nan(step.cpu_us_per_gpu_sample, 2) is None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        vs_prometheus.show("prometheus", step)
    assert "CPU    n/a us per GPU-sample" in out.getvalue() and "   n/a B stored" in out.getvalue()


def test_the_fleet_ratio_is_bounded_by_both_sides_edges() -> None:
    vs_prometheus = bench_module("vs_prometheus")

    def steps(kept: dict[int, bool]) -> list[Any]:
        out = []
        for gpus, ok in kept.items():
            s = vs_prometheus.Step(gpus)
            s.kept_up = ok
            out.append(s)
        return out

    prom = steps({16_000: True, 24_000: False})
    # The ladder's ratio is 96,000 / 16,000 = 6; the edges allow 4 to 7.
    assert vs_prometheus.fleet_bounds(prom, steps({24_000: True, 96_000: True, 112_000: False})) == (4.0, 7.0)
    # gpufleet kept up with every size tried: no upper bound.
    assert vs_prometheus.fleet_bounds(prom, steps({96_000: True})) == (4.0, None)
    # Prometheus kept up with every size: no lower bound.
    assert vs_prometheus.fleet_bounds(steps({16_000: True}), steps({96_000: True, 112_000: False})) == (
        None,
        7.0,
    )
    # A size failed below the largest kept (noise) is not an edge.
    assert vs_prometheus.fleet_bounds(
        steps({16_000: False, 18_000: True, 20_000: False}), steps({90_000: True, 100_000: False})
    ) == (4.5, 100_000 / 18_000)


def test_the_exporter_simulator_counts_refused_connections_instead_of_a_traceback_each() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(
        [sys.executable, "bench/vs_prometheus.py", "--serve-exporter", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=few_descriptors,
    )
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                break
            except OSError:
                assert time.monotonic() < deadline, "the simulator did not start"
                time.sleep(0.2)
        for _ in range(120):  # more than its 64 descriptors: the kernel queues them, its accepts fail
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(6.5)  # past one 5-s report
    finally:
        for c in held:
            c.close()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "connections refused in the last 5 s, out of file descriptors (limit 64)" in err
    assert "Traceback" not in err


def test_a_prometheus_too_far_behind_to_answer_leaves_its_storage_not_measured(tmp_path: Path) -> None:
    # Far past its edge Prometheus took more than two minutes over its snapshot and the run ended
    # there, losing every figure measured before; now that step's storage figures are "n/a".
    vs_prometheus = bench_module("vs_prometheus")
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        detail: dict[str, object] = {}
        t0 = time.monotonic()
        got = vs_prometheus.stored_bytes(
            f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path, detail, timeout_s=0.3
        )
        assert time.monotonic() - t0 < 5
    assert all(np.isnan(v) for v in got)
    assert str(detail["not_measured"]).startswith(
        "storage: Prometheus did not answer for its snapshot (ReadTimeout"
    )
    step = vs_prometheus.Step(64_000, detail=detail)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        vs_prometheus.show("prometheus", step)
    assert "64000 GPUs: not measured: storage: Prometheus did not answer" in out.getvalue()


def test_stored_bytes_reads_the_snapshot_prometheus_names(tmp_path: Path) -> None:
    vs_prometheus = bench_module("vs_prometheus")
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    (tmp_path / "snapshots" / "snap1").mkdir(parents=True)
    (tmp_path / "snapshots" / "snap1" / "chunk").write_bytes(b"x" * 2050)
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "000001").write_bytes(b"y" * 4100)

    class Prom(BaseHTTPRequestHandler):
        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # /metrics: 205 samples appended, 200 of them the exporter's (8 GPUs x 25)
            self._send(
                b"# TYPE prometheus_tsdb_head_samples_appended_total counter\n"
                b'prometheus_tsdb_head_samples_appended_total{type="float"} 205\n'
            )

        def do_POST(self) -> None:
            self._send(json.dumps({"status": "success", "data": {"name": "snap1"}}).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Prom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        detail: dict[str, object] = {}
        stored, wal = vs_prometheus.stored_bytes(
            f"http://127.0.0.1:{server.server_address[1]}", tmp_path, detail
        )
    finally:
        server.shutdown()
    assert detail == {}
    # 200 exporter samples are 8 GPU-samples: 2050 / 8 and 4100 / 8 bytes.
    assert stored == pytest.approx(2050 / 8) and wal == pytest.approx(4100 / 8)


def test_read_side_times_every_route_page_and_panel_on_a_tiny_fleet() -> None:
    """bench/read_side.py --quick end to end: it synthesises a fleet through the storing step and the
    rollups, serves the API, and every read it times answers without an error beside its baseline."""
    res = subprocess.run(
        [sys.executable, "bench/read_side.py", "--quick", "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last["name"] == "read_side" and last["quick"] is True
    counts = last["counts"]
    assert counts["gpu_samples"] > 0 and counts["gpu_stats_1m"] > counts["gpu_samples"] // 2
    assert counts["gpu_energy_1h"] > 0 and counts["runs"] > 0 and counts["incidents"] > 0
    reads = last["reads_timed"]
    kinds = {r["kind"] for r in reads}
    assert kinds == {"api", "web", "panel"}
    names = {r["name"] for r in reads}
    assert {"GET /v1/runs", "GET /v1/accounting (30 d, by team)", "/ (fleet)", "/finance"} <= names
    # every board at each of the four ranges
    for board in (
        "gpufleet-fleet",
        "gpufleet-run",
        "gpufleet-node",
        "gpufleet-energy",
        "gpufleet-starvation",
    ):
        for rng in ("6h", "24h", "7d", "30d"):
            assert any(n.startswith(f"{board} {rng} #") for n in names), (board, rng)
    failed = [(r["name"], r["error"]) for r in reads if r["error"]]
    assert not failed, failed
    assert all(r["cold_ms"] is not None and r["baseline_ms"] is not None for r in reads)
    assert "synthesised:" in res.stdout
    # the leader's part: ended runs' power-cap points kept before the reads are timed
    assert "leader_points" in last["synthesis_s"] and "power-cap points of" in res.stdout


def test_ledger_truth_counts_idle_gpus_named_and_every_gpu_of_a_hang_within_the_window() -> None:
    """An idle label counts the GPUs it names, a hang every GPU of the run (dead ranks and spinners),
    each clipped to the run's accounted window; other kinds put nothing in the truth."""
    ledger_truth = bench_module("ledger_truth")
    runs = {
        "r": {
            "gpu_count": 4,
            "gpu_hours": 4.0,
            "window_start": "2026-01-01T00:00:00Z",
            "window_end": "2026-01-01T01:00:00Z",
        }
    }
    labels = {
        "incidents": [
            {
                "kind": "idle_allocation",
                "run_id": "r",
                "start": "2025-12-31T23:30:00Z",
                "end": "2026-01-01T00:30:00Z",
                "evidence": {"gpus": [{"node": "n", "gpu": 0}, {"node": "n", "gpu": 1}]},
            },
            {
                "kind": "hung_collective",
                "run_id": "r",
                "start": "2026-01-01T00:45:00Z",
                "end": None,
                "evidence": {"dead_gpus": [{"node": "n", "gpu": 3}]},
            },
            {
                "kind": "checkpoint_stall",
                "run_id": "r",
                "start": "2026-01-01T00:00:00Z",
                "end": "2026-01-01T01:00:00Z",
                "evidence": {},
            },
        ]
    }
    got = ledger_truth.truth(labels, runs)
    assert got == {"r": {"idle": 2 * 0.5 / 4.0, "hung": 4 * 0.25 / 4.0}}


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python <argv>`` (a bench script and its options) from the checkout, its output captured."""
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def _last_json(res: subprocess.CompletedProcess[str]) -> Any:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fleet_lines_times_the_installed_text_beside_an_earlier_one() -> None:
    """bench/fleet_lines.py on a tiny fleet: both texts give the same lines (it exits otherwise) and each
    period has both timings; an unknown baseline text is refused by name."""
    res = _bench("bench/fleet_lines.py", "--gpus", "8", "--days", "0.5", "--repeat", "1")
    last = _last_json(res)
    assert last["name"] == "fleet_lines" and last["baseline_text"] == "gpufleet_accounting.v4"
    assert set(last["periods"]) == {"2d", "7d", "30d"}
    assert all(p["installed"] > 0 and p["baseline"] > 0 for p in last["periods"].values())
    bad = _bench("bench/fleet_lines.py", "--gpus", "8", "--days", "0.1", "--baseline", "gpufleet_ledger.v1")
    assert bad.returncode != 0 and "gpufleet_ledger.v1: not a text of gpufleet_accounting" in bad.stderr
    # the periods asked for, the longest's figure as the value; V6 beside V5
    res = _bench(
        "bench/fleet_lines.py", "--gpus", "8", "--days", "0.5", "--repeat", "1",
        "--periods", "1,0.25", "--baseline", "gpufleet_accounting.v5",
    )  # fmt: skip
    last = _last_json(res)
    assert set(last["periods"]) == {"0.25d", "1d"} and last["baseline_text"] == "gpufleet_accounting.v5"
    assert last["value"] == last["periods"]["1d"]["installed"] and last["unit"].startswith("ms (p50, 1-day")
    bad = _bench("bench/fleet_lines.py", "--gpus", "8", "--days", "0.1", "--periods", "0")
    assert bad.returncode != 0 and "--periods must be positive numbers of days" in bad.stderr


#: The folders an earlier tree's ``gpufleet`` is made of (``gpufleet/`` links the others).
_TREE_TOPS = ("gpufleet", "agent", "api", "collector", "dashboards", "migrations")


def _tree_before_last_migration(dest: Path) -> str:
    """This tree as it was before its last migration was committed (HEAD while it is not yet), from the
    repository's history, written to ``dest``; returns that tree's head revision.

    A copy of this tree without its last migration is no earlier tree: its code may read what only that
    migration makes (a table, a column)."""
    import tarfile

    versions = sorted((ROOT / "migrations" / "versions").glob("0*.py"))
    last = versions[-1].relative_to(ROOT)

    def git(*args: str) -> bytes:
        got = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)
        assert got.returncode == 0, f"git {' '.join(args)}: {got.stderr.decode()[-500:]}"
        return got.stdout

    shallow = git("rev-parse", "--is-shallow-repository").decode().strip()
    assert shallow == "false", (
        "the earlier tree comes from history: a shallow clone holds none (git fetch --unshallow)"
    )
    added = git("log", "--diff-filter=A", "--format=%H", "-1", "--", str(last)).decode().strip()
    commit = f"{added}^" if added else "HEAD"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(git("archive", "--format=tar", commit, *_TREE_TOPS))) as tar:
        tar.extractall(dest, filter="tar")
    assert not (dest / last).exists(), f"{commit} already holds {last}"
    return versions[-2].name.split("_", 1)[0]


def test_accounting_before_after_puts_the_earlier_trees_functions_back(tmp_path: Path) -> None:
    """bench/accounting_before_after.py against an earlier tree: this one before its last migration.
    The copy of the data is migrated down to that tree's head (this tree's downgrades put back its
    texts), each side reads its own definitions over the same rows, and they agree."""
    tree = tmp_path / "earlier"
    before = _tree_before_last_migration(tree)
    res = _bench(
        "bench/accounting_before_after.py",
        "--baseline-tree",
        str(tree),
        "--gpus",
        "8",
        "--runs",
        "2",
        "--days",
        "0.1",
        "--repeat",
        "1",
        "--rounds",
        "1",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"baseline database at revision {before}" in res.stdout
    last_line = json.loads(res.stdout.strip().splitlines()[-1])
    assert last_line["name"] == "accounting_before_after" and last_line["runs"] == 2
    assert last_line["max_rel_err_energies"] < 1e-9
    # a tree whose migrations are not this tree's is refused by name
    (tree / "migrations" / "versions" / "0099_elsewhere.py").write_text(
        f'revision = "0099"\ndown_revision = "{before}"\n'
    )
    bad = _bench("bench/accounting_before_after.py", "--baseline-tree", str(tree))
    assert bad.returncode != 0 and "ends at revision 0099, not one of this tree's" in bad.stderr


def test_price_ahead_select_times_the_pass_with_and_without_the_end_indexes() -> None:
    """bench/price_ahead_select.py on a small table: both selects timed with migration 0025's indexes and
    without them (dropped in a transaction rolled back, so the scratch database keeps them)."""
    res = _bench(
        "bench/price_ahead_select.py", "--incidents", "2000", "--runs", "200", "--days", "2", "--repeat", "2"
    )
    last = _last_json(res)
    assert last["name"] == "price_ahead_select" and last["incidents"] == 2000
    assert last["value"] > 0 and last["baseline"] > 0 and last["runs_ms"] > 0
