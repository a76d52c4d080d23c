"""Runs and their GPU allocations.

A GPU belongs to at most one run at any instant unless sharing is declared:
the database refuses an allocation, or a change of a run's start or end, that
would make two runs hold one GPU at once (migrations 0003 and 0004), except
when every run holding it declares sharing of one kind (time-slicing or MPS
with a share of the GPU, or distinct MIG instances) and the shares never add
up to more than the whole GPU; :class:`Conflict` carries its message, which
names the other run, the node and the GPU.  Accounting splits a shared GPU's
energy and GPU-hours by those shares, so nothing is counted twice.

Who may do what (``as_node``: the node a node token was issued for; ``None``
for admin, the CLI and replay, which keep every power) is decided in one
place, :mod:`gpufleet.store.authority`, which every write here asks first.

Runs the collector inferred from GPU samples (``source = 'inferred'``,
:mod:`gpufleet.store.inferred`) give way to registrations: a registered run
that takes their GPUs ends them or takes those GPUs from them, and
registering an inferred run's own id adopts it (a node token may adopt one
that holds a GPU of its node).
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from gpufleet.config import TeamSettings
from gpufleet.store import authority, inferred
from gpufleet.store.authority import NODE_TIME_BOUND, REGISTERED_BY, Actor, RunAuthorityError
from gpufleet.store.run_model import overlaps_sql, state_sql
from gpufleet.teams import slurm_labels, team_for

__all__ = ["NODE_TIME_BOUND", "REGISTERED_BY", "Conflict", "Invalid", "NotFound", "RunAuthorityError"]


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


class Invalid(ValueError):
    """A value the API's schema would refuse, from a caller that bypasses it (the CLI); names the field."""

    def __init__(self, field: str, msg: str) -> None:
        super().__init__(f"{field}: {msg}")
        self.field = field


#: Run ids: what the API accepts (no '/': a run id is one path segment of /v1/runs/{run_id}).
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@\-]{0,127}")

RUN_SELECT = f"""
SELECT r.run_id, r.name, r.site, r.team, r.start, r."end", r.params, r.labels, r.source,
  {state_sql("r", "now()")} AS state,
  COALESCE((SELECT json_agg(CASE WHEN a.sharing = 'exclusive' THEN json_build_object('node', a.node, 'gpus', a.gpus)
                                 ELSE json_build_object('node', a.node, 'gpus', a.gpus, 'sharing', a.sharing,
                                                        'share', a.share, 'mig_profile', a.mig_profile,
                                                        'mig_instance', a.mig_instance) END
                            ORDER BY a.node, a.gpus[1])
            FROM (SELECT node, sharing, share, mig_profile, mig_instance, array_agg(gpu ORDER BY gpu) AS gpus
                  FROM run_allocations WHERE run_id = r.run_id
                  GROUP BY node, sharing, share, mig_profile, mig_instance) a), '[]'::json) AS allocations,
  (SELECT count(*) FROM run_allocations WHERE run_id = r.run_id)::int AS gpu_count,
  (SELECT coalesce(sum(share), 0) FROM run_allocations WHERE run_id = r.run_id)::float8 AS gpu_equivalents
FROM runs r"""

#: How a run holds a GPU: alone, or declared shared (time-slicing, MPS, a MIG instance).
SHARING = ("exclusive", "time_slice", "mps", "mig")
#: Compute slices of a whole GPU in MIG mode (A100, H100, H200, B200; an A30 has 4: give ``share``).
MIG_SLICES = 7
MIG_PROFILE_RE = re.compile(r"([1-8])g\.(\d{1,3})gb(\+me)?")


def mig_share(profile: str, slices: int = MIG_SLICES) -> float:
    """The share of a GPU a MIG instance of ``profile`` (``3g.40gb``) is: its compute slices of ``slices``."""
    m = MIG_PROFILE_RE.fullmatch(profile.strip().lower())
    if m is None or int(m.group(1)) > slices:
        raise Invalid("mig_profile", f"{profile!r} is not a MIG profile such as '1g.10gb' or '3g.40gb'")
    return int(m.group(1)) / slices


def allocation_rows(
    allocations: list[dict[str, Any]],
) -> list[tuple[str, int, str, float, str | None, int | None]]:
    """(node, gpu, sharing, share, mig_profile, mig_instance) of every GPU, each entry checked: a GPU list,
    a known sharing, a share in (0, 1] for time-slicing and MPS (1 when exclusive), a MIG profile and
    instance for MIG (its share the profile's slices of the GPU unless given)."""
    rows = []
    for i, a in enumerate(allocations):
        where = f"allocations[{i}] (node {a.get('node')!r})"
        gpus = a.get("gpus") or []
        if not gpus:
            raise Invalid("allocations", f"{where}: no GPUs given; name them, e.g. NODE:0,1")
        sharing = a.get("sharing") or "exclusive"
        share = a.get("share")
        profile, instance = a.get("mig_profile"), a.get("mig_instance")
        if sharing not in SHARING:
            raise Invalid(
                "allocations", f"{where}: sharing must be one of {', '.join(SHARING)}, not {sharing!r}"
            )
        if sharing == "exclusive":
            if share not in (None, 1, 1.0) or profile is not None or instance is not None:
                raise Invalid(
                    "allocations",
                    f"{where}: an exclusive allocation takes the whole GPU; declare "
                    "sharing (time_slice, mps or mig) to give a share",
                )
            share = 1.0
        elif sharing == "mig":
            if profile is None or instance is None:
                raise Invalid("allocations", f"{where}: a MIG allocation needs mig_profile and mig_instance")
            share = mig_share(profile) if share is None else share
        elif share is None:
            raise Invalid(
                "allocations",
                f"{where}: {sharing} needs the share of the GPU the run declares (0 < share <= 1)",
            )
        if not 0 < float(share) <= 1:
            raise Invalid("allocations", f"{where}: share must be in (0, 1], not {share}")
        if sharing != "mig" and (profile is not None or instance is not None):
            raise Invalid("allocations", f"{where}: mig_profile and mig_instance are for sharing 'mig'")
        for g in gpus:
            rows.append((a["node"], int(g), sharing, float(share), profile, instance))
    return rows


def new_run_id() -> str:
    return "run-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def get_run(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(RUN_SELECT + " WHERE r.run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise NotFound(f"run {run_id!r} not found")
    return row


def list_runs(
    conn: psycopg.Connection,
    state: str | None = None,
    site: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Runs overlapping [since, until), newest first."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    if state is not None:
        where.append(f"{state_sql('r', 'now()')} = %s")
        params.append(state)
    if site:
        where.append("r.site = %s")
        params.append(site)
    if since:
        where.append(overlaps_sql("r", lo="%s"))
        params.append(since)
    if until:
        where.append(overlaps_sql("r", hi="%s"))
        params.append(until)
    sql = RUN_SELECT + " WHERE " + " AND ".join(where) + " ORDER BY r.start DESC, r.run_id LIMIT %s OFFSET %s"
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, [*params, limit, offset]).fetchall()


def _check_site(conn: psycopg.Connection, site: str | None) -> None:
    if site is not None and conn.execute("SELECT 1 FROM sites WHERE site = %s", (site,)).fetchone() is None:
        raise NotFound(f"site {site!r} is not registered; create it first")


def _pairs(allocations: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(node, gpu) of every GPU of the allocations, each entry checked as :func:`allocation_rows` does."""
    return [(r[0], r[1]) for r in allocation_rows(allocations)]


def add_allocations(conn: psycopg.Connection, run_id: str, allocations: list[dict[str, Any]]) -> list[str]:
    """Insert the allocations; returns warnings (a node that has never reported is accepted, and said so)."""
    rows = allocation_rows(allocations)
    if not rows:
        return []
    conn.execute(
        "INSERT INTO run_allocations (run_id, node, gpu, sharing, share, mig_profile, mig_instance) "
        "SELECT %s, n, g, sh, s, mp, mi FROM unnest(%s::text[], %s::int[], %s::text[], %s::float8[], %s::text[], "
        "%s::int[]) AS u(n, g, sh, s, mp, mi) ON CONFLICT DO NOTHING",
        (run_id, *([r[k] for r in rows] for k in range(6))),
    )
    nodes = sorted({r[0] for r in rows})
    seen = {
        n
        for (n,) in conn.execute(
            "SELECT node FROM nodes WHERE node = ANY(%s) AND (last_seen IS NOT NULL "
            "OR gpu_count IS NOT NULL)",
            (nodes,),
        ).fetchall()
    }
    return [
        f"node {n!r} has never reported telemetry: the allocation is kept, but its GPUs have no energy until "
        "an agent on that node (by that name) sends samples; check the node name"
        for n in nodes
        if n not in seen
    ]


def check_run_id(run_id: str) -> None:
    if not RUN_ID_RE.fullmatch(run_id):
        raise Invalid("run_id", f"{run_id!r} must match {RUN_ID_RE.pattern} (one path segment: no '/')")


def create_run(
    conn: psycopg.Connection,
    spec: dict[str, Any],
    *,
    as_node: str | None = None,
    now: datetime | None = None,
    teams: TeamSettings | None = None,
) -> tuple[dict[str, Any], bool]:
    """Register a run; registering the same run again merges its allocations.

    Returns (run, created).  A second registration with a different start or
    site is a conflict (a scheduler hook on each node of a job registers the
    same run; they must agree).  An allocation that overlaps another run's is
    a conflict naming that run, the node and the GPU.  ``as_node``: the caller
    is that node's token (:mod:`gpufleet.store.authority`).  A ``slurm`` block
    (the job's account, user and partition, as its prolog saw them) becomes the
    run's ``slurm.*`` labels, and without a ``team`` the team ``teams`` maps them
    to (:mod:`gpufleet.teams`).
    """
    now = now or datetime.now(UTC)
    who = authority.as_node(as_node)
    run_id = spec.get("run_id") or new_run_id()
    check_run_id(run_id)
    start = spec.get("start") or now
    end = spec.get("end")
    allocations = spec.get("allocations") or []
    labels = dict(spec.get("labels") or {})
    if end is not None and end < start:
        raise Conflict("end is before start")
    authority.check_create(who, {**spec, "run_id": run_id}, now)
    if who.is_node:
        labels = {REGISTERED_BY: f"node:{as_node}"}
    labels.update(slurm_labels(spec.get("slurm")))
    team = spec.get("team") or team_for(labels, teams)
    try:
        with conn.transaction():
            if who.is_node and spec.get("site") is not None:
                row = conn.execute("SELECT site FROM nodes WHERE node = %s", (as_node,)).fetchone()
                authority.check_node_site(who, spec, row[0] if row else None)
            _check_site(conn, spec.get("site"))
            cur = conn.execute(
                'INSERT INTO runs (run_id, name, site, team, start, "end", params, labels) '
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                (
                    run_id,
                    spec.get("name"),
                    spec.get("site"),
                    team,
                    start,
                    end,
                    spec.get("params"),
                    Jsonb(labels),
                ),
            )
            created = cur.fetchone() is not None
            if not created:
                existing = _locked(conn, run_id)
                if existing["source"] == "inferred":
                    authority.check_adopt(who, existing, spec)
                    # Given fields win and the others stay as inferred: a start after the end its samples
                    # gave it, with no end of its own, would be a run ending before it began.
                    adopted_start = spec.get("start") or existing["start"]
                    adopted_end = spec["end"] if spec.get("end") is not None else existing["end"]
                    if adopted_end is not None and adopted_end < adopted_start:
                        raise Conflict(
                            f"run {run_id!r} was inferred from samples and ended at "
                            f"{adopted_end.isoformat()}, before the start "
                            f"{adopted_start.isoformat()}; register it with its end as well, "
                            "or with a start before that end"
                        )
                    inferred.adopt(conn, run_id, {**spec, "start": spec.get("start")}, labels)
                    existing = get_run(conn, run_id)
                else:
                    authority.check_join(who, existing, spec, now)
                    if spec.get("start") is not None and existing["start"] != spec["start"]:
                        raise Conflict(f"run {run_id!r} exists with start {existing['start'].isoformat()}")
                    if spec.get("site") is not None and existing["site"] != spec["site"]:
                        raise Conflict(f"run {run_id!r} exists at site {existing['site']!r}")
                start, end = existing["start"], existing["end"]
            inferred.yield_to(
                conn, run_id, start, end, _pairs(allocations), closed_before=authority.closed_before(who, now)
            )
            warnings = add_allocations(conn, run_id, allocations)
    except psycopg.errors.ExclusionViolation as e:
        raise Conflict(e.diag.message_primary or str(e)) from None
    run = get_run(conn, run_id)
    if warnings:
        run["warnings"] = warnings
    return run, created


def _locked(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """The run, its row locked until the caller's transaction ends: what authority is checked against is
    what the write changes."""
    conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
    return get_run(conn, run_id)


def update_run(
    conn: psycopg.Connection,
    run_id: str,
    changes: dict[str, Any],
    *,
    as_node: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    who = authority.as_node(as_node)
    try:
        with conn.transaction():
            existing = _locked(conn, run_id)
            changes = authority.check_update(who, existing, changes, now)
            sets, params = [], []
            for col in ("name", "team", "params"):
                if col in changes:
                    sets.append(f"{col} = %s")
                    params.append(changes[col])
            if "end" in changes:
                end = changes["end"]
                if end is not None and end < existing["start"]:
                    raise Conflict("end is before the run's start")
                sets.append('"end" = %s')
                params.append(end)
            if changes.get("labels") is not None:
                sets.append("labels = labels || %s")
                params.append(Jsonb(changes["labels"]))
            if existing["source"] == "inferred" and "end" in changes:
                # Someone ends (or reopens) it by hand: theirs to end from now on, not the grace rule's.
                sets.append("source = 'registered'")
            if existing["source"] == "registered" and ("end" in changes or changes.get("allocations")):
                held = [(a["node"], g) for a in existing["allocations"] for g in a["gpus"]]
                inferred.yield_to(
                    conn,
                    run_id,
                    existing["start"],
                    changes.get("end", existing["end"]),
                    held + _pairs(changes.get("allocations") or []),
                    closed_before=authority.closed_before(who, now),
                )
            if sets:
                conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = %s", [*params, run_id])
            warnings = (
                add_allocations(conn, run_id, changes["allocations"]) if changes.get("allocations") else []
            )
    except psycopg.errors.ExclusionViolation as e:
        raise Conflict(e.diag.message_primary or str(e)) from None
    run = get_run(conn, run_id)
    if warnings:
        run["warnings"] = warnings
    return run


def record_progress(
    conn: psycopg.Connection,
    run_id: str,
    time: datetime,
    tokens: float | None,
    samples: float | None,
    *,
    as_node: str | None = None,
    now: datetime | None = None,
    steps: float | None = None,
    who: Actor | None = None,
) -> None:
    """Store a progress report; ``who`` (else the actor of ``as_node``) must be allowed it."""
    run = get_run(conn, run_id)
    authority.check_progress(who or authority.as_node(as_node), run, time, now or datetime.now(UTC))
    conn.execute(
        "INSERT INTO run_progress (run_id, time, tokens, samples, steps) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (run_id, time) DO UPDATE SET tokens = EXCLUDED.tokens, samples = EXCLUDED.samples, "
        "steps = EXCLUDED.steps",
        (run_id, time, tokens, samples, steps),
    )
