"""gpufleet-client lives in client/, a distribution of its own: its tests import it from there."""

from __future__ import annotations

import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"
if str(CLIENT) not in sys.path:
    sys.path.insert(0, str(CLIENT))

from tests.api.conftest import Api, api  # noqa: E402, F401  (the fixture)
