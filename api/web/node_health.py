"""The node page's fabric and quarantine sections.

Fabric: the host rows' network figures over the chart window
(:mod:`gpufleet.agent.sources.fabric`): the busiest NIC and InfiniBand/RoCE
port against their link speed, traffic each way, and the link faults counted
per interval (errors, drops, symbol errors, link downs and recoveries), the
last two being what implicates the network in a straggler
(:mod:`gpufleet.collector.detectors.fabric`).

Quarantine: whether the node is held out of scheduling and by what, and
every action the quarantine hooks took, dry-ran or failed
(:mod:`gpufleet.collector.quarantine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.api.web.html import Markup, badge, h, join, num, table, when
from gpufleet.api.web.svg import Series, Span, line_chart

#: Points per chart at most.
POINTS = 240
#: Link faults counted per interval, with their chart names.
FAULTS = (
    ("net_errors", "NIC errors"),
    ("net_drops", "NIC drops"),
    ("ib_symbol_errors", "IB symbol errors"),
    ("ib_link_error_recovery", "IB link recoveries"),
    ("ib_link_downed", "IB link downs"),
    ("ib_rx_errors", "IB receive errors"),
    ("ib_tx_discards", "IB transmit discards"),
)

FABRIC_SQL = """
SELECT extract(epoch FROM date_bin(make_interval(secs => %(step)s), time, %(lo)s)) AS t,
       max(net_util_pct) AS net_util, max(ib_util_pct) AS ib_util,
       avg(net_rx_bytes_s) AS net_rx, avg(net_tx_bytes_s) AS net_tx,
       avg(ib_rx_bytes_s) AS ib_rx, avg(ib_tx_bytes_s) AS ib_tx,
       max(ib_ports_down) AS ports_down, max(net_link_bytes_s) AS net_link, max(ib_link_bytes_s) AS ib_link,
       {faults}
FROM host_samples WHERE node = %(node)s AND time >= %(lo)s AND time < %(hi)s
GROUP BY 1 ORDER BY 1
""".format(faults=", ".join(f"sum({c}) AS {c}" for c, _ in FAULTS))

STATE_SQL = """
SELECT state, dry_run, reason, triggers, since, passing_since, backend, target FROM node_quarantine WHERE node = %s
"""
LOG_SQL = """
SELECT time, action, result, dry_run, reason, detail FROM quarantine_log WHERE node = %s
ORDER BY time DESC, id DESC LIMIT %s
"""

RESULT_BADGE = {
    "done": "ok",
    "dry_run": "muted",
    "failed": "critical",
    "rate_limited": "warning",
    "not_ours": "muted",
    "skipped": "muted",
}


def fabric_section(
    conn: psycopg.Connection, node: str, lo: datetime, hi: datetime, spans: Sequence[Span] = ()
) -> Markup:
    span = max((hi - lo).total_seconds(), 1.0)
    step = max(1.0, round(span / POINTS))
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(FABRIC_SQL, {"step": step, "lo": lo, "hi": hi, "node": node}).fetchall()
    if not any(
        r["net_util"] is not None
        or r["ib_util"] is not None
        or r["ib_rx"] is not None
        or r["ports_down"] is not None
        for r in rows
    ):
        return h(
            '<p class="empty">No fabric figures from this node in the window (an older agent, or a host '
            "source that does not read them).</p>"
        )
    t_range = (lo.timestamp(), max(hi.timestamp(), lo.timestamp() + 1.0))

    def s(name: str, col: str, scale: float = 1.0) -> Series:
        return Series(
            name, [(float(r["t"]), None if r[col] is None else float(r[col]) * scale) for r in rows]
        )

    util = line_chart(
        "Busiest link against its speed",
        [s("NIC", "net_util"), s("InfiniBand/RoCE", "ib_util")],
        "%",
        y_max=100.0,
        step_s=step,
        spans=spans,
        t_range=t_range,
    )
    traffic = line_chart(
        "Traffic",
        [
            s("NIC in", "net_rx", 8e-9),
            s("NIC out", "net_tx", 8e-9),
            s("IB in", "ib_rx", 8e-9),
            s("IB out", "ib_tx", 8e-9),
        ],
        "Gbit/s",
        step_s=step,
        spans=spans,
        t_range=t_range,
    )
    faults = [s(name, col) for col, name in FAULTS if any(r[col] for r in rows)]
    fault_chart = (
        line_chart("Link faults per interval", faults, "events", step_s=step, spans=spans, t_range=t_range)
        if faults
        else h(
            '<p class="ok">No NIC error or drop, no InfiniBand symbol error, link recovery or link down in the '
            "window.</p>"
        )
    )
    last = rows[-1]
    figures = table(
        ("NIC link speed", "IB link rate", "IB ports down", "Faults in the window"),
        [
            [
                num(None if last["net_link"] is None else float(last["net_link"]) * 8e-9, 0, "Gbit/s"),
                num(None if last["ib_link"] is None else float(last["ib_link"]) * 8e-9, 0, "Gbit/s"),
                "" if last["ports_down"] is None else int(last["ports_down"]),
                ", ".join(
                    f"{int(sum(r[c] or 0 for r in rows))} {name}"
                    for c, name in FAULTS
                    if any(r[c] for r in rows)
                )
                or "none",
            ]
        ],
        numeric=(0, 1, 2),
    )
    return join((figures, util, traffic, fault_chart))


def quarantine_section(conn: psycopg.Connection, node: str, limit: int = 50) -> Markup:
    with conn.cursor(row_factory=dict_row) as cur:
        state = cur.execute(STATE_SQL, (node,)).fetchone()
        log = cur.execute(LOG_SQL, (node, limit)).fetchall()
    if state is None:
        head = h('<p class="ok">Never quarantined.</p>')
    else:
        held = state["state"] == "quarantined"
        what = (
            ("held out of scheduling" + (" (dry run: nothing was done)" if state["dry_run"] else ""))
            if held
            else "released"
        )
        triggers = ", ".join(_trigger(t) for t in state["triggers"] or []) or "nothing any more"
        passing = (
            h(" Passing since {}.", when(state["passing_since"])) if held and state["passing_since"] else ""
        )
        head = h(
            "<p>{} {} since {} ({} on {}). Held by: {}.{}</p>",
            badge(
                "quarantined" if held else "released",
                "critical" if held and not state["dry_run"] else "warning" if held else "ok",
            ),
            what,
            when(state["since"]),
            state["backend"],
            state["target"],
            triggers,
            passing,
        )
    rows = table(
        ("Time", "Action", "Result", "Reason", "Detail"),
        (
            [
                when(r["time"]),
                r["action"].replace("_", " "),
                badge(r["result"], RESULT_BADGE.get(r["result"], "muted")),
                r["reason"] or "",
                r["detail"] or "",
            ]
            for r in log
        ),
        empty="No quarantine action on this node.",
    )
    return join((head, rows))


def _trigger(t: Any) -> str:
    if not isinstance(t, dict):
        return "?"
    if t.get("source") == "incident":
        return f"incident {t.get('id')} ({t.get('kind')} {t.get('cause') or ''})".replace(" )", ")")
    return f"failed check {t.get('check')} on {t.get('subject')}"
