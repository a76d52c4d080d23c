"""``/docs`` that renders offline: Swagger UI 5 (which reads the OpenAPI 3.1 the API serves) from files
vendored in the package (``swagger_ui/``, Apache-2.0, from the npm package ``swagger-ui-dist``), never
from a CDN that a fleet's air-gapped network cannot reach."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

SWAGGER_UI_VERSION = "5.36.0"
ASSET_DIR = Path(__file__).parent / "swagger_ui"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
}


@cache
def _asset(name: str) -> bytes:
    return (ASSET_DIR / name).read_bytes()


@router.get("/docs")
def docs() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="gpufleet API",
        swagger_js_url=f"/docs/assets/swagger-ui-bundle.js?v={SWAGGER_UI_VERSION}",
        swagger_css_url=f"/docs/assets/swagger-ui.css?v={SWAGGER_UI_VERSION}",
        swagger_favicon_url="/static/favicon.svg",
    )


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404, "no such asset")
    return Response(_asset(name), media_type=ASSETS[name], headers={"Cache-Control": "public, max-age=86400"})
