"""An OpenAPI description of the API's web view (pages, sign-in form, assets), which the API leaves out
of its own ``/openapi.json``: the generated-request suite reads it to reach those routes too."""

from __future__ import annotations

from typing import Any

_TEXT = {"type": "string"}
_HTML = {"description": "page", "content": {"text/html": {"schema": _TEXT}}}
_ANSWERS = {
    "200": _HTML,
    "303": {"description": "to the sign-in form or the next page"},
    "400": _HTML,
    "401": _HTML,
    "403": _HTML,
    "404": _HTML,
    "413": _HTML,
}


def _get(*params: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"parameters": list(params), "responses": _ANSWERS}}


def _query(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": _TEXT}


def _login_post(token: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "properties": {"token": token, "next": _TEXT},
                        # browsers send only the two, an attacker anything: extra fields are generated too
                        "additionalProperties": _TEXT,
                    }
                }
            },
        },
        "responses": _ANSWERS,
    }


_HOURS = {"name": "hours", "in": "query", "required": False, "schema": _TEXT}
#: Values of ``hours`` that float() reads but a time window cannot use, and others around them.
TRICKY_HOURS = [
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-Infinity",
    "1e400",
    "1e-400",
    "-1",
    "0",
    "0.01",
    "1",
    "6",
    "all",
    "ALL",
    "",
    " ",
    "1_0",
    "0x10",
    "abc",
]

#: Period bounds of the finance page and its downloads: dates and times it reads, and others around them.
TRICKY_PERIODS = [
    "2026-12-01",
    "2026-12-01T10:00:00Z",
    "2026-12-01T10:00:00+05:30",
    "2026-12-01T10:00:00",
    "2026-02-30",
    "0001-01-01",
    "9999-12-31",
    "1970-01-01T00:00:00Z",
    "nan",
    "",
    " ",
    "today",
    "2026-12-01T25:00:00Z",
    "2026-12-01T10:00:00+24:00",
    "20261201",
    "1e400",
]
_PERIOD = [
    {"name": k, "in": "query", "required": False, "schema": {"enum": TRICKY_PERIODS}} for k in ("from", "to")
]
_GROUP = {
    "name": "group_by",
    "in": "query",
    "required": False,
    "schema": {"enum": ["run", "site", "team", "x", ""]},
}

#: Every web route with anything in its path, query and form.
WEB_SCHEMA: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "gpufleet web view", "version": "1"},
    "paths": {
        "/": _get(),
        "/runs": _get(),
        "/runs/{run_id}": _get({"name": "run_id", "in": "path", "required": True, "schema": _TEXT}, _HOURS),
        "/incidents": _get(_query("state")),
        "/accounting": _get(),
        "/finance": _get(_query("from"), _query("to"), _query("group_by")),
        "/finance/report.csv": _get(_query("from"), _query("to"), _query("group_by")),
        "/finance/report.json": _get(_query("from"), _query("to"), _query("group_by")),
        "/nodes/{node}": _get({"name": "node", "in": "path", "required": True, "schema": _TEXT}),
        "/docs": _get(),
        "/docs/assets/{name}": _get({"name": "name", "in": "path", "required": True, "schema": _TEXT}),
        "/readyz": _get(),
        "/static/web.css": _get(),
        "/favicon.ico": _get(),
        "/login": {**_get(_query("next")), "post": _login_post(_TEXT)},
        "/logout": {"post": {"responses": _ANSWERS}},
    },
}


def known_schema(run_id: str, tokens: list[str]) -> dict[str, Any]:
    """The routes past their 404 and 401: an existing run's page with any ``hours``, the finance page
    and its download with dates around the ones they read, and the sign-in form with a valid token and
    anything else (generated values never hit those by chance)."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpufleet web view, known values", "version": "1"},
        "paths": {
            f"/runs/{run_id}": _get({**_HOURS, "schema": {"enum": TRICKY_HOURS}}),
            "/finance": _get(*_PERIOD, _GROUP),
            "/finance/report.csv": _get(*_PERIOD, _GROUP),
            "/login": {"post": _login_post({"enum": tokens})},
        },
    }


def crowded_form_schema() -> dict[str, Any]:
    """The sign-in form with more fields than it allows (at least 11)."""
    post = _login_post(_TEXT)
    post["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"].update(
        {"minProperties": 11, "maxProperties": 60}
    )
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpufleet sign-in, crowded", "version": "1"},
        "paths": {"/login": {"post": post}},
    }
