"""Write prometheusrule.yaml from deploy/prometheus/rules/gpufleet.rules.yml.

The rules file is the one source (promtool checks and unit-tests it); the
Prometheus Operator resource is derived from it:

    python deploy/k8s/monitoring/render_prometheusrule.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "prometheus" / "rules" / "gpufleet.rules.yml"
OUT = HERE / "prometheusrule.yaml"
HEADER = (
    "# Generated from deploy/prometheus/rules/gpufleet.rules.yml by render_prometheusrule.py;\n"
    "# edit the rules file and re-run it (a test keeps the two identical).\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> Any:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpufleet", "labels": {"app.kubernetes.io/part-of": "gpufleet"}},
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
