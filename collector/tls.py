"""Client certificates in the ASGI scope, so mTLS can be tied to a node token.

uvicorn verifies a client certificate against ``ssl_ca_certs`` but does not
hand it to the application.  The protocol classes here (the collector's own,
or h11's where httptools is missing, plus one step in ``connection_made``)
read the verified peer certificate from the connection's SSL object once per
connection and add the ASGI TLS extension to the scope of every request on
it::

    scope["extensions"]["tls"] = {
        "client_cert_chain": [PEM of the peer certificate],
        "client_cert_name": "CN=node-01,O=...",
        "client_cert_error": None,
        "client_cert_names": ["node-01", ...],   # CN and DNS names: what a node may be
    }

``gpufleet collector`` uses them whenever a client CA is configured
(:func:`protocol_class`, through ``service.server_options``); the API reads
no client certificate.  :func:`client_cert_names` is what the ingest path
gives :meth:`gpufleet.auth.Principal.require_certificate` to tie the token to its node.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

ASGIApp = Any


def tls_extension(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The TLS extension of a connection whose client presented a verified certificate (else None)."""
    sslobj = transport.get_extra_info("ssl_object")
    if sslobj is None:
        return None
    peer = sslobj.getpeercert()  # only certificates the CA verified are returned
    der = sslobj.getpeercert(binary_form=True)
    if not peer or not der:
        return None
    subject = [(k, v) for rdn in peer.get("subject", ()) for k, v in rdn]
    names = [v for k, v in subject if k == "commonName"]
    names += [v for k, v in peer.get("subjectAltName", ()) if k == "DNS"]
    return {
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)],
        "client_cert_name": ",".join(f"{_SHORT.get(k, k)}={v}" for k, v in reversed(subject)),
        "client_cert_error": None,
        "client_cert_names": sorted(set(names)),
    }


_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
}


def client_cert_names(scope: Mapping[str, Any]) -> list[str] | None:
    """CN and DNS names of the request's verified client certificate; None when there is none."""
    ext = scope.get("extensions", {}).get("tls")
    if not ext:
        return None
    names: list[str] = ext.get("client_cert_names", [])
    return names


def with_tls(app: ASGIApp, ext: dict[str, Any]) -> ASGIApp:
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope.setdefault("extensions", {})["tls"] = ext
        await app(scope, receive, send)

    return wrapped


class _PeerCertMixin:
    app: ASGIApp
    tls_ext: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        ext = tls_extension(transport)
        if ext is not None:
            self.tls_ext = ext
            self.app = with_tls(self.app, ext)


class TLSH11Protocol(_PeerCertMixin, H11Protocol):
    pass


def protocol_class(client_certs: bool = True) -> type[asyncio.Protocol] | str:
    """The collector's HTTP protocol: uvicorn's httptools protocol answering plain shipments on
    the connection (:mod:`gpufleet.collector.ingest_protocol`), passing verified client
    certificates on when ``client_certs``; h11 (or uvicorn's own choice) without httptools."""
    try:
        from gpufleet.collector.ingest_protocol import IngestProtocol
    except ImportError:
        return TLSH11Protocol if client_certs else "auto"
    if not client_certs:
        return IngestProtocol

    class TLSIngestProtocol(_PeerCertMixin, IngestProtocol):
        pass

    return TLSIngestProtocol
