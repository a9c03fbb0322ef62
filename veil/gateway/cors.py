"""Requests from browser pages of other origins (CORS): pages of the origins the operator names
(`--cors-origin`) may call the REST API and read its answers; any other page's are answered without
CORS headers, so its browser keeps them from the page's scripts. Credentials travel in headers
(X-Auth-Hash, Authorization), never in cookies, so no answer allows credentials: a page can act for
a user only with a credential the page itself holds."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

ANY = "*"
REQUEST_HEADERS = (
    "Content-Type, X-Auth-Hash, Authorization, Idempotency-Key, X-Valid-For, X-Signature, X-Key-Id, X-Registry-Version"
)
EXPOSED = "Retry-After, X-Registry-Version"
METHODS = "GET, POST, PUT, DELETE"
PREFLIGHT_SECONDS = "600"  # how long a browser may keep a preflight's answer


def cors(origins: tuple[str, ...]) -> Middleware:
    """The middleware (outermost: error answers carry the headers too)."""
    allowed = frozenset(origins)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        permitted = origin is not None and (ANY in allowed or origin in allowed)
        if request.method == "OPTIONS" and origin is not None and "Access-Control-Request-Method" in request.headers:
            if not permitted:
                return web.Response(status=403, headers={"Vary": "Origin"})
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Allow-Headers": REQUEST_HEADERS, "Access-Control-Max-Age": PREFLIGHT_SECONDS,
                "Vary": "Origin",
            })  # fmt: skip
        response = await handler(request)
        if permitted and origin is not None and not response.prepared:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED
            response.headers.add("Vary", "Origin")
        return response

    return middleware
