"""Cross-reference checks pydantic cannot express field by field.

A run naming a node that does not exist, a fault on a GPU index past the
node's count, two runs holding one GPU at once: each is reported with the key
the user has to fix (``faults[3].node``), all at once rather than one per try.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.sim.profiles import PROFILES

if TYPE_CHECKING:
    from gpufleet.sim.scenario import NodeGroupSpec, Scenario

Problem = tuple[str, str]


def crosscheck(sc: Scenario) -> list[Problem]:
    problems: list[Problem] = []
    sites = _unique(problems, "sites", [s.site for s in sc.sites], "site")
    _unique(problems, "carbon", [c.region for c in sc.carbon], "region")
    nodes = _check_nodes(sc, sites, problems)
    runs = _check_runs(sc, sites, nodes, problems)
    _check_faults(sc, nodes, runs, problems)
    return problems


def _unique(problems: list[Problem], key: str, values: list[str], what: str) -> set[str]:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            problems.append((f"{key}[{i}].{what}", f"duplicate {what} {v!r}"))
        seen.add(v)
    return seen


def _check_nodes(sc: Scenario, sites: set[str], problems: list[Problem]) -> dict[str, NodeGroupSpec]:
    nodes: dict[str, NodeGroupSpec] = {}
    for i, g in enumerate(sc.nodes):
        key = f"nodes[{i}]"
        if (g.names is None) == (g.prefix is None or g.count is None):
            problems.append((key, "give either names, or prefix and count"))
            continue
        if g.names is not None and (g.prefix is not None or g.count is not None):
            problems.append((key, "give either names, or prefix and count, not both"))
        if g.site not in sites:
            problems.append((f"{key}.site", f"unknown site {g.site!r} (sites: {', '.join(sorted(sites))})"))
        for name in g.node_names():
            if name in nodes:
                problems.append((f"{key}", f"node {name!r} defined twice"))
            nodes[name] = g
    return nodes


def _check_runs(
    sc: Scenario, sites: set[str], nodes: dict[str, NodeGroupSpec], problems: list[Problem]
) -> dict[str, tuple[float, float]]:
    runs: dict[str, tuple[float, float]] = {}
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for i, r in enumerate(sc.runs):
        key = f"runs[{i}]"
        if r.run_id in runs:
            problems.append((f"{key}.run_id", f"duplicate run_id {r.run_id!r}"))
        if r.start_s >= sc.duration_s:
            problems.append((f"{key}.start_s", f"starts at or after the scenario end ({sc.duration_s} s)"))
        if r.site is not None and r.site not in sites:
            problems.append((f"{key}.site", f"unknown site {r.site!r}"))
        end = r.start_s + r.duration_s if r.duration_s is not None else float("inf")
        runs[r.run_id] = (r.start_s, end)
        if (
            r.workload.eval_period_s is not None
            and r.workload.eval_period_s[0] <= r.workload.eval_duration_s[1]
        ):
            problems.append((f"{key}.workload.eval_period_s", "must be longer than eval_duration_s"))
        for j, n in enumerate(r.nodes):
            if n not in nodes:
                problems.append((f"{key}.nodes[{j}]", f"unknown node {n!r}"))
                continue
            count = nodes[n].gpus
            gpus = r.gpus if r.gpus is not None else list(range(count))
            for g in gpus:
                if g >= count:
                    problems.append((f"{key}.gpus", f"GPU {g} does not exist on {n} ({count} GPUs)"))
                    continue
                for s0, e0, other in held.get((n, g), []):
                    if r.start_s < e0 and s0 < end:
                        problems.append(
                            (f"{key}.nodes[{j}]", f"GPU {n}:{g} is already held by run {other!r} then")
                        )
                held.setdefault((n, g), []).append((r.start_s, end, r.run_id))
        if len(set(r.nodes)) != len(r.nodes):
            problems.append((f"{key}.nodes", "a node is listed twice"))
    return runs


def _check_faults(
    sc: Scenario,
    nodes: dict[str, NodeGroupSpec],
    runs: dict[str, tuple[float, float]],
    problems: list[Problem],
) -> None:
    run_nodes = {r.run_id: r for r in sc.runs}
    for i, f in enumerate(sc.faults):
        key = f"faults[{i}]"
        if f.start_s >= sc.duration_s:
            problems.append((f"{key}.start_s", f"starts at or after the scenario end ({sc.duration_s} s)"))
        run_id = getattr(f, "run_id", None)
        if run_id is not None and run_id not in runs:
            problems.append(
                (f"{key}.run_id", f"unknown run {run_id!r} (runs: {', '.join(sorted(runs)) or 'none'})")
            )
            continue
        node = getattr(f, "node", None)
        if node is not None and node not in nodes:
            problems.append((f"{key}.node", f"unknown node {node!r}"))
            continue
        sub = getattr(f, "nodes", None)
        if sub is not None and run_id is not None:
            for j, n in enumerate(sub):
                if n not in run_nodes[run_id].nodes:
                    problems.append((f"{key}.nodes[{j}]", f"node {n!r} is not one of run {run_id!r}'s"))
        gpus = getattr(f, "gpus", None)
        if gpus is not None and node is not None:
            for g in gpus:
                if g >= nodes[node].gpus:
                    problems.append(
                        (f"{key}.gpus", f"GPU {g} does not exist on {node} ({nodes[node].gpus} GPUs)")
                    )
        pick = getattr(f, "pick", None)
        if pick is not None:
            if run_id is not None:
                r = run_nodes[run_id]
                known = [n for n in r.nodes if n in nodes]  # unknown ones are reported with the run
                avail = len(known) * len(r.gpus) if r.gpus is not None else sum(nodes[n].gpus for n in known)
            else:
                assert node is not None
                avail = nodes[node].gpus
            if pick > avail:
                problems.append((f"{key}.pick", f"picks {pick} GPUs of only {avail}"))
        if f.kind == "pcie_degraded":
            targets = [node] if node is not None else run_nodes[run_id].nodes if run_id else []
            for n in targets:
                if n not in nodes:
                    continue
                prof = PROFILES[nodes[n].gpu_model]
                if f.gen is not None and f.gen >= prof.pcie_gen_max:
                    problems.append(
                        (f"{key}.gen", f"gen {f.gen} is not below {n}'s maximum {prof.pcie_gen_max}")
                    )
                if f.width is not None and f.width >= prof.pcie_width_max:
                    problems.append(
                        (f"{key}.width", f"x{f.width} is not below {n}'s maximum x{prof.pcie_width_max}")
                    )
        if f.kind in ("nvlink_down", "nvlink_fallback", "nvlink_errors"):
            targets = [node] if node is not None else run_nodes[run_id].nodes if run_id else []
            for n in targets:
                if n in nodes and PROFILES[nodes[n].gpu_model].nvlink_links == 0:
                    problems.append((f"{key}.kind", f"{n}'s {nodes[n].gpu_model} has no NVLink"))
