"""``/docs`` that works offline: Swagger UI's JavaScript and CSS come from the ``swagger-ui-bundle``
package and are served by the API itself, never from a CDN (FastAPI's default page loads them from one,
which a fleet's air-gapped network cannot reach)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

ASSETS = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}


@cache
def _asset(name: str) -> bytes:
    from swagger_ui_bundle import swagger_ui_path

    return (Path(swagger_ui_path) / name).read_bytes()


@router.get("/docs")
def docs() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="gpufleet API",
                               swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url="/docs/assets/swagger-ui.css",
                               swagger_favicon_url="/static/favicon.svg")


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404, "no such asset")
    return Response(_asset(name), media_type=ASSETS[name], headers={"Cache-Control": "public, max-age=86400"})
