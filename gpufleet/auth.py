"""Bearer tokens: issued once, stored hashed, checked in constant time.

Roles: ``node`` (ingest for exactly one node name, and its scheduler hook's
runs; reads nothing), ``progress`` (progress reports of runs from training
code, optionally only of runs on one node; nothing else), ``finance``
(accounting and reports), ``sre`` (everything read-only), ``admin`` (sites,
prices, tokens, runs).  What a node or progress token may change about a run
is decided in :mod:`gpufleet.store.authority`.  The secret is shown only when
the token is created; the database keeps its SHA-256, and neither appears in
logs or error bodies.
``remote_write`` is a Prometheus remote-writing the fleet's exporters: it may
write samples of any node through ``/api/v1/write`` and do nothing else.

Who may do what is declared here once, as capabilities held by roles, and
every surface asks :meth:`Principal.require` (or :meth:`Principal.may`) for a
capability instead of comparing role names: the API's routes
(``gpufleet.api.deps.allowed``), its web pages (``gpufleet.api.web.session``),
the collector's ingest and remote write, and the tie of a node token to its
node's client certificate (:meth:`Principal.require_certificate`).  A
``/metrics`` scrape carries no token of a role: its own static credential is
checked by :mod:`gpufleet.metricsauth`.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg

from gpufleet.names import is_node_name

Role = Literal["node", "progress", "finance", "sre", "admin", "remote_write"]
ROLES: tuple[Role, ...] = ("node", "progress", "finance", "sre", "admin", "remote_write")
#: Roles whose token names a node: required for ``node``, optional for ``progress``.
NODE_ROLES: frozenset[Role] = frozenset({"node", "progress"})
PREFIX = "gpf_"

#: What each role may do; every surface asks for a capability, never a role.
CAPABILITIES: dict[str, frozenset[Role]] = {
    #: Shipments of samples through ``/v1/ingest``, of the token's own node only.
    "ingest": frozenset({"node"}),
    "read": frozenset({"sre", "admin"}),
    #: What is addressed to the token's own node (its power caps), and nothing of other nodes.
    "read_own_node": frozenset({"node"}),
    "read_accounting": frozenset({"finance", "sre", "admin"}),
    "write_runs": frozenset({"admin", "node"}),
    "report_progress": frozenset({"admin", "node", "progress"}),
    "admin": frozenset({"admin"}),
    #: Prometheus remote write (``POST /api/v1/write``): samples of any node, nothing else.
    "remote_write": frozenset({"remote_write"}),
    #: Browser sign-in: a node token lives on its node, never in a browser.
    "sign_in": frozenset(set(ROLES) - {"node"}),
}
#: How a refusal names a capability, where its name alone would not tell the client what to use instead.
_REFUSAL = {
    "ingest": "ingest; use a node token",
    "remote_write": "remote-write; use a token of role remote_write",
}


class AuthError(Exception):
    """401: no usable credentials.  The message never contains the token."""


class AccessDenied(Exception):
    """403: authenticated, but the token's role lacks the capability, or its node is not the client
    certificate's."""


def capabilities_of(role: str) -> list[str]:
    return [c for c, roles in CAPABILITIES.items() if role in roles]


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    role: Role
    node: str | None

    def may(self, capability: str) -> bool:
        return self.role in CAPABILITIES[capability]

    def require(self, capability: str) -> None:
        if not self.may(capability):
            what = _REFUSAL.get(capability, capability.replace("_", " "))
            raise AccessDenied(f"role '{self.role}' may not {what}")

    def require_certificate(self, cert_names: Sequence[str] | None) -> None:
        """mTLS: a node token is honoured only beside its own node's verified client certificate, so a
        stolen token is useless without that certificate; no certificate, no tie (None)."""
        if cert_names is not None and self.node not in cert_names:
            raise AccessDenied(
                f"the client certificate is for {', '.join(cert_names) or 'no node name'}, "
                f"not for node {self.node!r} of this token"
            )


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def parse_bearer(header: str | None) -> str:
    if not header:
        raise AuthError("missing Authorization: Bearer token")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthError("Authorization header must be 'Bearer <token>'")
    value = value.strip()
    if len(value) > 200 or not value.isascii() or not value.isprintable():
        raise AuthError("malformed bearer token")
    return value


def create_token(conn: psycopg.Connection, name: str, role: Role, node: str | None = None) -> str:
    """Insert a token and return its secret (the only time it is visible)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if role == "node" and node is None:
        raise ValueError("a node token needs --node")
    if node is not None and role not in NODE_ROLES:
        raise ValueError(f"--node is for roles node and progress, not {role}")
    if node is not None and not is_node_name(node):
        raise ValueError(
            f"--node {node!r} is not a node name agents can send: 1-253 characters of "
            "[A-Za-z0-9._-], starting with a letter or digit"
        )
    secret = new_secret()
    conn.execute(
        "INSERT INTO agent_tokens (name, token_hash, role, node) VALUES (%s, %s, %s, %s)",
        (name, hash_secret(secret), role, node),
    )
    return secret


def revoke_token(conn: psycopg.Connection, name: str) -> bool:
    cur = conn.execute(
        "UPDATE agent_tokens SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL", (name,)
    )
    return cur.rowcount > 0


#: (token_hash, id, name, role, revoked_at, node)
TokenRow = tuple[bytes, int, str, Role, object, str | None]

_MISS = object()


class TokenCache:
    """Maps secret digests to principals (or None for unknown/revoked) for ``ttl_s``.

    Lookups are by hash, so the secret itself is never compared with a
    stored value; the found hash is still checked with ``hmac.compare_digest``.
    A revocation is honoured within ``ttl_s``.

    Each entry lives a random 75 to 100 % of ``ttl_s``: entries filled in one
    burst (every node's first shipment after a start) would otherwise all
    expire in the same second and send the whole fleet to the database at
    once.  Refusals are kept apart from principals, each side bounded on its
    own, so a flood of made-up tokens empties only the refusals and never
    pushes the fleet's own tokens out.
    """

    def __init__(self, ttl_s: float = 5.0, max_entries: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        #: digest -> (expiry on the monotonic clock, principal), and the refused digests' expiries
        self._known: dict[bytes, tuple[float, Principal]] = {}
        self._refused: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()

    def __len__(self) -> int:
        return len(self._known) + len(self._refused)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()
            self._refused.clear()

    def forget_unknown(self) -> None:
        """Drop the cached refusals (a token added since may be one of them), keep the principals."""
        with self._lock:
            self._refused.clear()

    def get(self, digest: bytes) -> Principal | object | None:
        """The cached principal, None if known-bad, or ``MISS``."""
        now = time.monotonic()
        with self._lock:
            hit = self._known.get(digest)
            refused = self._refused.get(digest) if hit is None else None
        if hit is not None:
            return hit[1] if now <= hit[0] else _MISS
        return None if refused is not None and now <= refused else _MISS

    def put(self, digest: bytes, row: TokenRow | None) -> Principal | None:
        principal = None
        if row is not None and hmac.compare_digest(bytes(row[0]), digest) and row[4] is None:
            principal = Principal(token_id=row[1], name=row[2], role=row[3], node=row[5])
        expiry = time.monotonic() + self.ttl_s * self._rng.uniform(0.75, 1.0)
        with self._lock:
            if principal is None:
                self._known.pop(digest, None)
                if len(self._refused) >= self.max_entries:
                    self._refused.clear()
                self._refused[digest] = expiry
            else:
                self._refused.pop(digest, None)
                if len(self._known) >= self.max_entries:
                    self._known.clear()
                self._known[digest] = (expiry, principal)
        return principal


MISS = _MISS

LOOKUP_SQL = "SELECT token_hash, id, name, role, revoked_at, node FROM agent_tokens WHERE token_hash = %s"
#: The same for many digests at once (the collector's coalesced lookups).
LOOKUP_MANY_SQL = (
    "SELECT token_hash, id, name, role, revoked_at, node FROM agent_tokens "
    "WHERE token_hash = ANY(%s::bytea[])"
)
