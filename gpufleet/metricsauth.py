"""Who may read a ``/metrics`` endpoint: an optional bearer token and optional client certificate names.

The collector's and the agent's ``/metrics`` are open unless configured: a
Prometheus endpoint usually is, but the collector's names nodes, run ids and
incident evidence.  A token is compared in constant time and never logged;
certificate names are those of a certificate the TLS layer already verified
against the configured CA (``gpufleet.collector.tls``).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: A refusal: HTTP status, message, response headers.
Refusal = tuple[int, str, dict[str, str]]


class MetricsAuthError(ValueError):
    """The /metrics protection is misconfigured (a token file that cannot be read, a short token)."""


def read_token(token: str | None, token_file: Path | None, what: str) -> str | None:
    """The configured token: ``token`` itself, or the first line of ``token_file``."""
    if token is not None and token_file is not None:
        raise MetricsAuthError(f"{what}: give a token or a token file, not both")
    if token_file is not None:
        try:
            lines = token_file.read_text().splitlines()
        except OSError as e:
            raise MetricsAuthError(f"{what}: cannot read token file {token_file}: {e.strerror or e}") from e
        token = lines[0].strip() if lines else ""
    if token is not None and (len(token) < 16 or not token.isascii() or not token.isprintable()):
        raise MetricsAuthError(f"{what}: the token must be at least 16 printable ASCII characters")
    return token


@dataclass(frozen=True)
class MetricsGuard:
    """Checks a scrape; with neither a token nor names configured, everyone may read."""

    token: str | None = None
    client_names: Sequence[str] = ()

    @property
    def open(self) -> bool:
        return self.token is None and not self.client_names

    def refusal(self, authorization: str | None, cert_names: Sequence[str] | None) -> Refusal | None:
        if self.client_names:
            if cert_names is None:
                return 403, "a client certificate is required for /metrics", {}
            if not set(cert_names) & set(self.client_names):
                return 403, "this client certificate may not read /metrics", {}
        if self.token is not None:
            scheme, _, value = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                return 401, "missing Authorization: Bearer token", {"WWW-Authenticate": "Bearer"}
            if not hmac.compare_digest(value.strip().encode("utf-8", "replace"), self.token.encode()):
                return 401, "invalid token", {"WWW-Authenticate": "Bearer"}
        return None
