"""The long-running processes: ``gpufleet collector``, ``gpufleet api`` and ``gpufleet agent``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, database, fail, settings_from, setup_logging
from gpufleet.config import Settings


def _ssl(s: Settings) -> dict[str, Any]:
    import ssl

    if not s.tls.certfile:
        return {}
    kw: dict[str, Any] = {
        "ssl_certfile": str(s.tls.certfile),
        "ssl_keyfile": str(s.tls.keyfile or s.tls.certfile),
    }
    if s.tls.client_ca:
        kw["ssl_ca_certs"] = str(s.tls.client_ca)
        kw["ssl_cert_reqs"] = ssl.CERT_REQUIRED if s.tls.client_cert == "required" else ssl.CERT_OPTIONAL
        # uvicorn verifies the client certificate but does not pass it on; the collector's
        # protocol (service.server_options) adds it to the scope, where ingest ties it to the
        # token's node.
    return kw


def collector(
    config: ConfigOpt = None,
    db: DbOpt = None,
    host: Annotated[str | None, typer.Option(help="listen address")] = None,
    port: Annotated[int | None, typer.Option(help="listen port")] = None,
) -> None:
    """Run the collector: ingest, rollups, detector sweeps (one leader), /metrics."""
    import uvicorn

    from gpufleet.collector import cyclegc
    from gpufleet.collector.service import build_collector, server_options
    from gpufleet.metricsauth import MetricsAuthError

    s = settings_from(config, db)
    setup_logging(s)
    url = database(s)
    try:
        service = build_collector(url, s)
    except MetricsAuthError as e:
        fail(str(e))
    cyclegc.settle(s.gc_young_threshold)
    uvicorn.run(
        service,
        host=host or s.collector_host,
        port=port or s.collector_port,
        log_level=s.log_level.lower(),
        access_log=False,
        **server_options(s),
        **_ssl(s),
    )


def api(
    config: ConfigOpt = None,
    db: DbOpt = None,
    host: Annotated[str | None, typer.Option(help="listen address")] = None,
    port: Annotated[int | None, typer.Option(help="listen port")] = None,
) -> None:
    """Run the API (runs, incidents, accounting, reports, web view)."""
    import uvicorn

    from gpufleet.api.app import create_app
    from gpufleet.collector import cyclegc
    from gpufleet.connguard import guarded_protocol

    s = settings_from(config, db)
    setup_logging(s)
    service = create_app(database(s), s)
    cyclegc.settle(s.gc_young_threshold)
    uvicorn.run(
        service,
        host=host or s.api_host,
        port=port or s.api_port,
        http=guarded_protocol(),
        log_level=s.log_level.lower(),
        access_log=False,
        **_ssl(s),
    )


def agent(
    config: ConfigOpt = None,
    node: Annotated[
        str | None, typer.Option(help="node name the samples are filed under (default: host name)")
    ] = None,
    collector_url: Annotated[str | None, typer.Option(help="collector base URL")] = None,
    token: Annotated[
        str | None, typer.Option(help="node token (prefer GPUFLEET_AGENT__TOKEN or --token-file)")
    ] = None,
    token_file: Annotated[Path | None, typer.Option(help="file holding the node token")] = None,
    source: Annotated[
        list[str] | None, typer.Option(help="source to run (repeatable; default: settings)")
    ] = None,
    spool_dir: Annotated[Path | None, typer.Option(help="spool directory")] = None,
    interval: Annotated[float | None, typer.Option(help="sampling interval, seconds")] = None,
    ship_interval: Annotated[float | None, typer.Option(help="seal-and-ship interval, seconds")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="/metrics port (0 disables)")] = None,
    sim: Annotated[
        str | None, typer.Option(help="run a simulated node of this scenario instead of real sources")
    ] = None,
    fake_nvml: Annotated[
        int | None, typer.Option(hidden=True, help="fake H100s instead of NVML (tests)")
    ] = None,
) -> None:
    """Run the node agent: sample GPUs and host, spool to disk, ship to the collector."""
    from pydantic import ValidationError

    from gpufleet.agent.main import AgentError, run
    from gpufleet.config import AgentSettings

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            fail(f"--token-file {token_file}: {e.strerror or e}")
    options = {
        "node": ("--node", node),
        "collector_url": ("--collector-url", collector_url),
        "token": ("--token", token),
        "sources": ("--source", source),
        "spool_dir": ("--spool-dir", spool_dir),
        "interval_s": ("--interval", interval),
        "ship_interval_s": ("--ship-interval", ship_interval),
        "metrics_port": ("--metrics-port", metrics_port),
    }
    overrides = {key: value for key, (_, value) in options.items() if value is not None}
    s = settings_from(config)
    if overrides:
        try:
            s = s.model_copy(
                update={"agent": AgentSettings.model_validate({**s.agent.model_dump(), **overrides})}
            )
        except ValidationError as e:
            fail(
                "; ".join(
                    f"{options.get(str(err['loc'][0]), (str(err['loc'][0]),))[0]}: {err['msg']}"
                    for err in e.errors()
                )
            )
    setup_logging(s)
    try:
        code = run(s, fake_nvml=fake_nvml, sim=sim)
    except AgentError as e:
        fail(str(e))
    raise typer.Exit(code)
