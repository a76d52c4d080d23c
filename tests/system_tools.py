"""Debian tools some tests drive for real (promtool, Alertmanager, Chromium, kubectl, systemd-analyze).

``make test`` installs them first (tools/system-deps.sh) and sets
``GPUFLEET_REQUIRE_SYSTEM_TOOLS=1``: there a missing tool fails the test,
since the check it guards would otherwise go unmet in silence.  A bare
``pytest`` run elsewhere skips, naming the package to install.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRED = os.environ.get("GPUFLEET_REQUIRE_SYSTEM_TOOLS", "") not in ("", "0")


def unavailable(what: str, package: str) -> NoReturn:
    msg = f"{what} is not installed (Debian package {package}; tools/system-deps.sh installs it)"
    if REQUIRED:
        pytest.fail(msg + ", although GPUFLEET_REQUIRE_SYSTEM_TOOLS is set")
    pytest.skip(msg)


def tool(name: str, package: str) -> str:
    """The path of ``name``, or the test stops as :func:`unavailable` says."""
    path = shutil.which(name)
    if path is None:
        unavailable(name, package)
    return path
