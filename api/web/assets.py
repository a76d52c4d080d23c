"""The stylesheet and the icon, served from the package (no build step, nothing external)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

FAVICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
    'fill="#2f5fb3"/><path d="M3 11h2V7H3zm4 0h2V4H7zm4 0h2V8h-2z" fill="#fff"/></svg>'
)
_CACHE = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}


@cache
def _css() -> bytes:
    return (Path(__file__).parent / "web.css").read_bytes()


@router.get("/static/web.css")
def stylesheet() -> Response:
    return Response(_css(), media_type="text/css; charset=utf-8", headers=_CACHE)


@router.get("/static/favicon.svg")
def favicon() -> Response:
    return Response(FAVICON_SVG, media_type="image/svg+xml", headers=_CACHE)


@router.get("/favicon.ico")
def favicon_ico() -> Response:
    """Browsers ask for it regardless of the page's icon link."""
    return Response(FAVICON_SVG, media_type="image/svg+xml", headers=_CACHE)
