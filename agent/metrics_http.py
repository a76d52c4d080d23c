"""The agent's ``/metrics`` listener: Prometheus exposition behind an optional bearer token and TLS.

prometheus_client's own server has TLS and client certificates but no
token; this one is the same WSGI server with the token check in front
(:class:`gpufleet.metricsauth.MetricsGuard`).  With ``client_ca`` the TLS
handshake itself refuses a client without a certificate that CA signed.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

from gpufleet.metricsauth import MetricsGuard

_REASONS = {401: "Unauthorized", 403: "Forbidden"}


def guarded(app: Callable[..., Iterable[bytes]], guard: MetricsGuard) -> Callable[..., Iterable[bytes]]:
    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        refused = guard.refusal(environ.get("HTTP_AUTHORIZATION"), None)
        if refused is None:
            return app(environ, start_response)
        status, detail, headers = refused
        start_response(
            f"{status} {_REASONS.get(status, 'Error')}",
            [("Content-Type", "text/plain; charset=utf-8"), *headers.items()],
        )
        return [detail.encode() + b"\n"]

    return wsgi


def serve(
    registry: CollectorRegistry,
    port: int,
    host: str,
    guard: MetricsGuard | None = None,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    client_ca: Path | None = None,
) -> WSGIServer:
    """Start serving in a daemon thread; returns the server (``server_address`` has the bound port)."""

    class Server(ThreadingWSGIServer):
        pass

    Server.address_family, addr = _get_best_family(host, port)
    app = make_wsgi_app(registry)
    httpd = make_server(
        addr,
        port,
        guarded(app, guard) if guard and not guard.open else app,
        Server,
        handler_class=_SilentHandler,
    )
    if certfile is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(certfile), str(keyfile or certfile))
        if client_ca is not None:
            ctx.load_verify_locations(cafile=str(client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, name="agent-metrics", daemon=True).start()
    return httpd
