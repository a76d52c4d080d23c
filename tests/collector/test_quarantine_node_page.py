"""The node page shows what the quarantine hooks did and the node's fabric, from the database as the
collector wrote it (the hooks run against a fake ``scontrol``; the host rows are the fabric rows an agent
computes from a captured H100 InfiniBand tree)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
from psycopg.types.json import Jsonb

from gpufleet.agent.sources.host import HostSource
from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.catalog import HOST_FIELDS
from gpufleet.collector.quarantine import Quarantine
from gpufleet.config import QuarantineSettings, Settings
from gpufleet.serverthread import serve
from tests.agent.test_fabric_source import bump, host_tree, move_net
from tests.collector.test_quarantine import FakeSlurm, incident, slurm  # noqa: F401  (the fixture)


def fabric_rows(tmp_path: Path, n: int, t0: datetime) -> list[dict[str, object]]:
    """Host rows of ``n`` seconds from the captured tree, with 12 symbol errors on mlx5_0 at the 10th."""
    proc, sys_root = host_tree(tmp_path)
    src = HostSource(proc, sys_root, rapl=False)
    src.collect()
    rows = []
    for k in range(n):
        move_net(proc, "eth0", rx=50_000_000, tx=5_000_000)
        bump(sys_root / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data", 2_500_000_000)
        if k == 10:
            bump(sys_root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error", 12)
        (proc / "uptime").write_text(f"{float((proc / 'uptime').read_text().split()[0]) + 1.0} 0\n")
        row = src.collect().host
        assert row is not None
        rows.append({**row, "time": t0 + timedelta(seconds=k)})
    return rows


def test_the_node_page_shows_its_quarantine_and_fabric(
    conn: psycopg.Connection,
    slurm: FakeSlurm,  # noqa: F811
    settings: Settings,
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    conn.execute(
        "INSERT INTO nodes (node, gpu_count, last_seen, facts) VALUES ('n8', 8, %s, %s)",
        (
            now,
            Jsonb(
                {
                    "checks_status": "fail",
                    "checks": [
                        {
                            "check": "ib_port",
                            "subject": "mlx5_0/1",
                            "status": "fail",
                            "finding": "12 symbol_error in 1 s (400 Gb/s IB)",
                        },
                        {
                            "check": "dcgm_diag",
                            "subject": "node",
                            "status": "skipped",
                            "finding": "DCGM not installed (dcgmi not on PATH)",
                        },
                    ],
                }
            ),
        ),
    )
    inc = incident(conn, "n8")
    q = Quarantine(QuarantineSettings(enabled=True, backend="slurm", dry_run=False, hold_down_s=0))
    q.run(conn, now.timestamp() - 120)
    names = [f.name for f in HOST_FIELDS]
    rows = fabric_rows(tmp_path, 30, now - timedelta(minutes=5))
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO host_samples (time, node, {', '.join(names)}) VALUES (%s, 'n8', "
            f"{', '.join(['%s'] * len(names))})",
            [[r["time"], *(r.get(n) for n in names)] for r in rows],
        )
    token = create_token(conn, "sre-node", "sre")
    with serve(create_app(conn.info.dsn, settings)) as srv:
        page = httpx.get(f"{srv.url}/nodes/n8", headers={"Authorization": f"Bearer {token}"}, timeout=60).text
    assert "<h2>Quarantine</h2>" in page and "held out of scheduling" in page
    assert (
        f"incident {inc} (gpu_health uncorrectable_ecc)" in page
        and "failed check ib_port on mlx5_0/1" in page
    )
    assert "slurm drain" in page and "drained" in page
    assert "<h2>Fabric</h2>" in page and "Busiest link against its speed" in page
    assert "12 IB symbol errors" in page and "400" in page
    assert "skipped" in page and "DCGM not installed" in page


def test_a_node_never_quarantined_without_fabric_says_so(
    conn: psycopg.Connection, settings: Settings
) -> None:
    conn.execute("INSERT INTO nodes (node, gpu_count, last_seen) VALUES ('n2', 8, now())")
    token = create_token(conn, "sre-node2", "sre")
    with serve(create_app(conn.info.dsn, settings)) as srv:
        page = httpx.get(f"{srv.url}/nodes/n2", headers={"Authorization": f"Bearer {token}"}, timeout=60).text
    assert "Never quarantined." in page and "No fabric figures from this node" in page
