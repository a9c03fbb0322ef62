"""Every exception a handler raises becomes one answer, chosen from one table (the nearest class in
the exception's MRO wins): a client's mistake is never a 500, overload and an unavailable store are
503 with Retry-After, and the store's refusals name the request field they concern. REST and
WebSocket applications both run this middleware."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from veil.gateway.context import GATEWAY
from veil.gateway.ingest import Overloaded
from veil.gateway.registry import stale
from veil.protocol import ProtocolError
from veil.protocol.errors import ID_FIELDS, unknown
from veil.store import (
    NotOwner,
    StaleRegistry,
    StoreUnavailable,
    TooMany,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)

log = logging.getLogger("veil.gateway")
STORE_RETRY_AFTER = 5  # seconds, when the store cannot take writes
Answer = tuple[ProtocolError, dict[str, str] | None]


def _overloaded(exc: Overloaded) -> Answer:
    return ProtocolError("", str(exc), 503), {"Retry-After": str(exc.retry_after)}


def _unavailable(exc: StoreUnavailable) -> Answer:
    message = f"the broker's store cannot take writes now ({exc}); nothing was stored"
    return ProtocolError("", message, 503), {"Retry-After": str(STORE_RETRY_AFTER)}


def _not_owner(exc: NotOwner) -> Answer:
    """Another client's announcement or publication is answered as none (its existence is not
    theirs to learn); a subscription id can only be refused as taken, since ids are global."""
    if exc.what == "subscription":
        return ProtocolError(ID_FIELDS[exc.what], "belongs to another client", 403), None
    return unknown(exc.what), None


def _too_many(exc: TooMany) -> Answer:
    problem = (
        f"this client has {exc.most} {exc.what}, the most one client may (--max-client-{exc.what}); remove one first"
    )
    return ProtocolError("webhook" if exc.what == "webhooks" else exc.what, problem, 429), None


# each answer takes the exception type it is listed under (Any: a mapping cannot say so per entry)
ANSWERS: dict[type[Exception], Callable[[Any], Answer]] = {
    ProtocolError: lambda exc: (exc, None),
    Overloaded: _overloaded,
    StoreUnavailable: _unavailable,
    NotOwner: _not_owner,
    StaleRegistry: lambda exc: (stale(exc.current, exc.base), None),
    TooMany: _too_many,
    UnknownSubscription: lambda exc: (unknown("subscription"), None),
    UnknownAnnouncement: lambda exc: (unknown("announcement"), None),
    UnknownPublication: lambda exc: (unknown("publication"), None),
}


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def error_response(error: ProtocolError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=error.to_json(), status=error.status, content_type="application/json", headers=headers)


class _JsonParseErrors(RequestHandler):
    """A request the HTTP layer cannot read (a header line over its limit, a malformed request line)
    never reaches the middleware: aiohttp answers it itself, in plain text. This handler makes that
    answer the same JSON error every other answer is (still logged, and the connection closed)."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)
        problem = message if message and status != 500 else HTTPStatus(status).phrase
        answer = error_response(ProtocolError("request", problem, status))
        answer.force_close()
        return answer


def json_parse_errors(factory: Callable[[], RequestHandler]) -> Callable[[], RequestHandler]:
    """The server's protocol factory, its handlers answering unreadable requests in JSON. aiohttp
    builds its handlers itself (no hook chooses their class), so each is given the subclass, which
    adds behaviour only (no state: `__slots__` is empty)."""

    def make() -> RequestHandler:
        handler = factory()
        handler.__class__ = _JsonParseErrors
        return handler

    return make


def _answer(request: web.Request, exc: Exception) -> web.Response:
    for cls in type(exc).__mro__:
        answer = ANSWERS.get(cls)
        if answer is not None:
            if isinstance(exc, StoreUnavailable):
                log.error("store unavailable on %s %s: %s", request.method, request.path, exc)
            return error_response(*answer(exc))
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(ProtocolError("body", f"request body larger than {request.client_max_size} bytes", 413))
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        return error_response(ProtocolError("path" if exc.status == 404 else "method", exc.reason, exc.status))
    log.error("internal error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(ProtocolError("", "internal error", 500))


@web.middleware
async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """While a request is being handled its connection is not a waiting one; between requests a
    keep-alive connection counts as waiting again (untimed: the keep-alive timer closes it), so that
    the bound on waiting connections also covers those that send one request and idle."""
    gateway = request.app[GATEWAY]
    unproven = gateway.unproven
    connection = request.protocol
    unproven.settle(connection)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _answer(request, exc)
    except Exception as exc:
        response = _answer(request, exc)
    finally:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            unproven.watch(connection, lambda _: transport.close(), timed=False)
    resource = request.match_info.route.resource  # counted by route: paths carry ids, routes do not
    gateway.metrics.responses.labels(resource.canonical if resource else "unmatched", str(response.status)).inc()
    return response
