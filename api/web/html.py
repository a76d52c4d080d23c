"""HTML built from Python with escaping by default, and the page layout.

Every value put into a page goes through :func:`esc` unless it is already
:class:`Markup` (HTML this module or :mod:`gpufleet.api.web.svg` built), so data from
the database -- run names, node names, incident evidence -- can never become
markup.  Small enough to read in one sitting; no template engine needed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any


class Markup(str):
    """Text that is already HTML (built here from escaped parts)."""

    __slots__ = ()


def esc(value: object) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def h(template: str, *args: object, **kwargs: object) -> Markup:
    """``template.format`` with every argument escaped (Markup arguments kept as they are)."""
    return Markup(template.format(*(esc(a) for a in args), **{k: esc(v) for k, v in kwargs.items()}))


def join(parts: Iterable[object], sep: str = "") -> Markup:
    return Markup(sep.join(esc(p) for p in parts))


def num(value: float | int | None, digits: int = 1, unit: str = "") -> Markup:
    """A number for humans; an em dash for missing or non-finite values."""
    if value is None:
        return Markup("&mdash;")
    v = float(value)
    if not math.isfinite(v):
        return Markup("&mdash;")
    text = f"{v:,.{digits}f}"
    return esc(f"{text} {unit}".rstrip())


def when(t: datetime | None) -> Markup:
    if t is None:
        return Markup("&mdash;")
    return h(
        '<time datetime="{}">{}</time>',
        t.astimezone(UTC).isoformat(),
        t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def when_short(t: datetime | None) -> Markup:
    """A time in a table cell: month-day and minutes (UTC), the full time on hover."""
    if t is None:
        return Markup("&mdash;")
    u = t.astimezone(UTC)
    return h(
        '<time datetime="{}" title="{}">{}</time>',
        u.isoformat(),
        u.strftime("%Y-%m-%d %H:%M:%S UTC"),
        u.strftime("%m-%d %H:%M"),
    )


def ago(seconds: float | None) -> Markup:
    if seconds is None or not math.isfinite(seconds):
        return Markup("&mdash;")
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return esc(f"{s / size:.1f} {unit}")
    return esc(f"{s:.0f} s")


def table(
    headers: Iterable[str],
    rows: Iterable[Iterable[object]],
    *,
    empty: str = "Nothing to show.",
    numeric: Iterable[int] = (),
    caption: str | None = None,
) -> Markup:
    heads = list(headers)
    right = set(numeric)
    body = []
    for row in rows:
        cells = "".join(
            h('<td class="num">{}</td>', c) if i in right else h("<td>{}</td>", c) for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        return h('<p class="empty">{}</p>', empty)
    cap = h("<caption>{}</caption>", caption) if caption else ""
    head = "".join(
        h('<th scope="col" class="num">{}</th>', x) if i in right else h('<th scope="col">{}</th>', x)
        for i, x in enumerate(heads)
    )
    return Markup(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def link(href: str, text: object) -> Markup:
    return h('<a href="{}">{}</a>', href, text)


def badge(text: str, kind: str) -> Markup:
    cls = kind if kind in ("critical", "warning", "ok", "muted") else "muted"
    return h('<span class="badge {}">{}</span>', cls, text)


NAV = (
    ("/", "Fleet", "read"),
    ("/runs", "Runs", "read"),
    ("/incidents", "Incidents", "read"),
    ("/accounting", "Accounting", "read_accounting"),
    ("/finance", "Finance", "read_accounting"),
    ("/waste", "Waste", "read_accounting"),
)


def page(
    title: str,
    body: Markup,
    *,
    who: Any = None,
    active: str = "",
    refresh_s: int | None = None,
    allowed: Iterable[str] = (),
) -> str:
    """A whole document: head, navigation (only what the viewer may open), body."""
    can = set(allowed)
    nav = "".join(
        h(
            '<a href="{}"{}>{}</a>',
            href,
            Markup(' aria-current="page"') if href == active else Markup(""),
            label,
        )
        for href, label, capability in NAV
        if capability in can
    )
    user = ""
    if who is not None:
        user = h(
            '<span class="who">{} ({})</span><form method="post" action="/logout" class="logout">'
            '<button type="submit">Log out</button></form>',
            who.name,
            who.role,
        )
    meta_refresh = h('<meta http-equiv="refresh" content="{}">', refresh_s) if refresh_s else ""
    return "<!doctype html>\n" + h(
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">{}'
        "<title>{} - gpufleet</title>"
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/web.css"></head>'
        '<body><header><a class="brand" href="/">gpufleet</a><nav>{}</nav><div class="user">{}</div></header>'
        "<main><h1>{}</h1>{}</main></body></html>",
        meta_refresh,
        title,
        Markup(nav),
        Markup(user),
        title,
        body,
    )
