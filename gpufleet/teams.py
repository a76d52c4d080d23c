"""Which team a run is billed to, from where its job came from.

A run registered without a team would reach the finance report as "no team".
Schedulers already know whose job it is: Slurm's account (and user and
partition), Kubernetes' namespace and labels.  The Slurm prolog sends the
job's account, user and partition with the registration
(``deploy/slurm/prolog.sh``: its environment, else ``sacct``, else
``scontrol``); the Kubernetes agent reports the namespace and labels of the
job's pods (``gpufleet.agent.k8s``, which maps them to a team by its own
``k8s.team_map``).  They become the run's labels ``slurm.account``,
``slurm.user``, ``slurm.partition``, ``k8s.namespace``, so runs, reports,
the FOCUS export's tags and the waste views show them, and the first of
``teams.from_labels`` a run carries names its team, through ``teams.map``
where an account or a namespace is not the team's own name.

A team given explicitly always wins; the mapping only fills the gap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpufleet.config import TeamSettings

#: The Slurm fields a registration may carry, and the run label each becomes.
SLURM_LABELS: dict[str, str] = {
    "account": "slurm.account",
    "user": "slurm.user",
    "partition": "slurm.partition",
}

#: What Slurm accepts as an account, user or partition name (and nothing that could start a formula or a
#: shell word): letters, digits, ``._-@+``, up to 128 characters.
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+\-]{0,127}")


def slurm_labels(job: Mapping[str, Any] | None) -> dict[str, str]:
    """The run labels of a registration's ``slurm`` block (fields that are empty are left out)."""
    if not job:
        return {}
    return {SLURM_LABELS[k]: str(v) for k, v in job.items() if k in SLURM_LABELS and v}


def team_for(labels: Mapping[str, Any], rules: TeamSettings | None = None) -> str | None:
    """The team the first of ``rules.from_labels`` found in ``labels`` names (mapped), or None."""
    rules = rules or TeamSettings()
    for key in rules.from_labels:
        value = labels.get(key)
        if not isinstance(value, str) or not value:
            continue
        mapped = rules.map.get(key, {}).get(value)
        if mapped:
            return mapped
        if rules.unmapped_is_team:
            return value
    return None
