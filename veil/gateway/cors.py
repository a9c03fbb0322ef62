"""Requests from browser pages (CORS, and what browsers send without asking): pages of the origins
the operator names (`--cors-origin`) may call the REST API and read its answers, and open delivery
connections; any other page may do neither.

Reading answers is what CORS headers grant. Doing is another matter: a browser sends a page's plain
POST (a form's, or `fetch` with a text body) and its WebSocket upgrade to any origin without asking,
with whatever credentials the browser holds for it, and a client certificate for mutual TLS is one
of those. So a request that changes something, or an upgrade, that carries an Origin not allowed is
refused (403) before it is served. Clients that are not browsers send no Origin and are not
concerned; nor is the gateway's own dashboard (its pages' origin is the gateway's REST address).
`*` allows any page, except on a connection that shows a client certificate: that page would act
with the browser's certificate, not with a credential of its own. Credentials are otherwise
headers (X-Auth-Hash, Authorization), never cookies, so no answer allows credentials."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from veil.gateway.http import certificate_of
from veil.protocol import ProtocolError

ANY = "*"
REQUEST_HEADERS = (
    "Content-Type, X-Auth-Hash, Authorization, Idempotency-Key, X-Valid-For, X-Signature, X-Key-Id, X-Registry-Version"
)
EXPOSED = "Retry-After, X-Registry-Version"
METHODS = "GET, POST, PUT, DELETE"
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
PREFLIGHT_SECONDS = "600"  # how long a browser may keep a preflight's answer


def permitted(request: web.Request, origin: str, allowed: frozenset[str], rest_port: int) -> bool:
    """Whether a page of `origin` may use what `request` asks for."""
    if origin in allowed:
        return True
    if ANY in allowed and certificate_of(request) is None:
        return True
    try:  # the gateway's own pages (the dashboard), on whichever of its listeners
        page = URL(origin)
        return page.host == request.url.host and page.port == rest_port
    except ValueError:
        return False


def refused(origin: str) -> web.Response:
    error = ProtocolError("Origin", f"a page of {origin[:200]!r} may not call this broker (--cors-origin)", 403)
    return web.Response(status=403, body=error.to_json(), content_type="application/json", headers={"Vary": "Origin"})


def cors(origins: tuple[str, ...], rest_port: int) -> Middleware:
    """The middleware (outermost: error answers carry the headers too)."""
    allowed = frozenset(origins)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if not permitted(request, origin, allowed, rest_port):
            if request.method not in SAFE or "Access-Control-Request-Method" in request.headers:
                return refused(origin)
            response = await handler(request)  # (answered, but the browser keeps it from the page)
            if not response.prepared:
                response.headers.add("Vary", "Origin")
            return response
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Allow-Headers": REQUEST_HEADERS, "Access-Control-Max-Age": PREFLIGHT_SECONDS,
                "Vary": "Origin",
            })  # fmt: skip
        response = await handler(request)
        if not response.prepared:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED
            response.headers.add("Vary", "Origin")
        return response

    return middleware
