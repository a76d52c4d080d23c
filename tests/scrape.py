"""Reading one value off a running service's ``/metrics``, as Prometheus would parse it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def sample_value(base_url: str, name: str, **labels: str) -> float:
    """The first sample called ``name`` (``_total``, ``_count`` and the like included) whose labels
    include ``labels``; 0 when there is none, as a counter never incremented is absent."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0
