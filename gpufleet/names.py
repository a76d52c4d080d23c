"""Name patterns shared by every entry point that accepts a node name.

Checked with ``fullmatch``: with ``re.match`` and a pattern ending in ``$``,
a trailing newline would pass (``$`` also matches before a final ``\\n``).
"""

from __future__ import annotations

import re

#: A host name as agents send it in ``node`` (gpufleet.wire.NODE_RE is the same pattern).
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,252}")


def is_node_name(value: object) -> bool:
    return isinstance(value, str) and NODE_RE.fullmatch(value) is not None
