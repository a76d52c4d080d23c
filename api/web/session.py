"""Browser sign-in with the same bearer tokens the API uses.

A browser cannot attach ``Authorization: Bearer`` to page loads, so the login
form posts the token once and gets it back as a cookie that scripts cannot
read (HttpOnly), that other sites' pages cannot make the browser send
(SameSite=Strict) and, over HTTPS, that is never sent in clear (Secure).
The token is checked by the API's own authenticator (cache, revocation), so a
revoked token stops working in the browser within seconds too.  It never
appears in a URL, a page or a log line.  A request that carries an
``Authorization`` header is judged by that header alone.
"""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gpufleet.api.deps import state
from gpufleet.api.web.html import Markup, h, page
from gpufleet.auth import Principal, capabilities_of

COOKIE = "gpufleet_token"
COOKIE_MAX_AGE_S = 12 * 3600
MAX_FORM_BYTES = 4096
#: The sign-in form has two fields (token, next); a few more are tolerated (browsers add none).
MAX_FORM_FIELDS = 10
#: Applied to every web response.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" would make form posts say Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


def secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def html(body: str, status: int = 200) -> HTMLResponse:
    return secure(HTMLResponse(body, status_code=status))  # type: ignore[return-value]


def capabilities(who: Principal) -> list[str]:
    return capabilities_of(who.role)


async def _principal_for(request: Request, token: str) -> Principal | None:
    """The principal of ``token`` through the API's authenticator; None when invalid or revoked."""
    if not token or len(token) > 200 or not token.isascii() or not token.isprintable():
        return None
    scope = dict(request.scope)
    scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"authorization"]
    scope["headers"].append((b"authorization", b"Bearer " + token.encode("ascii")))
    try:
        return await state(request).auth.principal(Request(scope))
    except HTTPException as e:
        if e.status_code == 401:
            return None
        raise


def bearer_secret(pasted: str) -> str:
    """The token as people paste it: alone, or as the demo and the docs print it (``Bearer gpf_...``)."""
    text = pasted.strip()
    scheme, _, rest = text.partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else text


async def viewer(request: Request) -> Principal | None:
    """Who is asking: the Authorization header if present (401 when bad), else the cookie."""
    if request.headers.get("authorization"):
        return await state(request).auth.principal(request)
    return await _principal_for(request, request.cookies.get(COOKIE, ""))


def _safe_next(target: str | None, default: str) -> str:
    """Only paths on this site: no scheme, no host, no protocol-relative ``//``."""
    if not target:
        return default
    parts = urlsplit(target)
    if (
        parts.scheme
        or parts.netloc
        or not target.startswith("/")
        or target.startswith("//")
        or "\\" in target
    ):
        return default
    return target


def landing(who: Principal) -> str:
    return "/" if who.may("read") else "/finance"


async def gate(request: Request, capability: str) -> Principal | Response:
    """The viewer if allowed; else the login page (no credentials) or a 403 page."""
    who = await viewer(request)
    if who is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response = secure(RedirectResponse("/login?next=" + quote(target, safe=""), status_code=303))
        if COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path="/")
        return response
    if not who.may(capability):
        body = h(
            '<p>Your role ({}) may not open this page.</p><p><a href="{}">Go to what you can see</a></p>',
            who.role,
            landing(who),
        )
        return html(page("Not allowed", body, who=who, allowed=capabilities(who)), 403)
    return who


def _login_form(next_path: str, error: str | None = None) -> str:
    err = h('<p class="error" role="alert">{}</p>', error) if error else Markup("")
    body = h(
        '{}<form method="post" action="/login" class="login">'
        '<label for="token">API token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required '
        'spellcheck="false">'
        '<input type="hidden" name="next" value="{}">'
        '<button type="submit">Sign in</button></form>'
        '<p class="hint">Use a token of role sre, admin or finance (<code>gpufleet token create</code>). '
        "It is kept in an HttpOnly cookie for 12 hours.</p>",
        err,
        next_path,
    )
    return page("Sign in", body)


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    return html(_login_form(_safe_next(next, "")))


def same_origin(request: Request) -> bool:
    """Whether a state-changing form post comes from this site's own pages.

    The browser's ``Origin`` decides when it sends one (``null``, from a sandboxed or privacy-stripped
    page, is refused); without it, ``Sec-Fetch-Site`` (``cross-site`` is refused) and then the
    ``Referer``'s host.  A request with none of them (a script, curl) is not a browser's cross-site post.
    """
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    if request.headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
        return False
    referer = request.headers.get("referer")
    return referer is None or urlsplit(referer).netloc == host


def cross_site_refused(what: str) -> Response:
    return html(
        page(
            "Refused",
            h('<p class="error">Cross-site {} refused: post the form from this site\'s own page.</p>', what),
        ),
        403,
    )


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return cross_site_refused("sign-in")
    raw = await request.body()  # at most MAX_FORM_BYTES: gpufleet.bodylimit caps /login before it gets here
    if len(raw) > MAX_FORM_BYTES:
        return html(_login_form("", "The form is too large."), 413)
    try:
        form = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=MAX_FORM_FIELDS)
    except ValueError:  # more fields than max_num_fields
        return html(_login_form("", f"The form has more than {MAX_FORM_FIELDS} fields."), 400)
    if any(len(v) > 1 for v in form.values()):
        return html(_login_form("", "A form field is given more than once."), 400)
    token = bearer_secret((form.get("token") or [""])[0])
    who = await _principal_for(request, token)
    next_path = _safe_next((form.get("next") or [""])[0], "")
    if who is None or not who.may("sign_in"):
        return html(
            _login_form(next_path, "That token is not valid (unknown, revoked, or a node token)."), 401
        )
    response = secure(RedirectResponse(next_path or landing(who), status_code=303))
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not same_origin(request):
        return cross_site_refused("sign-out")
    response = secure(RedirectResponse("/login", status_code=303))
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
