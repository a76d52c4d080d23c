"""Where a viewer lands when the page asked for is not theirs to see.

A finance token opening ``/`` (the fleet page, which needs ``read``) is sent to
``/finance``, the page its role exists for, instead of a 403 page: the web
view's address is what people are given, and finance people are given it too.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from gpufleet.api.web.session import landing, secure, viewer


async def or_landing(request: Request, refused: Response) -> Response:
    """``refused`` (the gate's answer), or a redirect to the viewer's landing page when the gate refused a
    signed-in viewer (403) and that page is another one."""
    if refused.status_code != 403:
        return refused
    who = await viewer(request)
    if who is None or landing(who) == request.url.path:
        return refused
    return secure(RedirectResponse(landing(who), status_code=303))
