# The API on loopback with a token per role, shared with tests/api.
from tests.api.conftest import api  # noqa: F401
