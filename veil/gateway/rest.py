"""REST endpoints of SPEC §2 (/publish, /subscribe, /unsubscribe) plus /health and /ready.

Every client mistake becomes a JSON error naming the field (never a 500); overload becomes 503 with
Retry-After.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from veil.gateway.ingest import Overloaded
from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.protocol import ProtocolError, parse_publication, parse_publication_batch, parse_subscribe, parse_unsubscribe
from veil.security.tls import peer_identity
from veil.store import NotOwner, UnknownSubscription

if TYPE_CHECKING:
    from veil.gateway.server import Broker

log = logging.getLogger("veil.gateway")
BATCH_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def error_response(error: ProtocolError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=error.to_json(), status=error.status, content_type="application/json", headers=headers)


@web.middleware
async def errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ProtocolError as exc:
        return error_response(exc)
    except Overloaded as exc:
        return error_response(ProtocolError("", str(exc), 503), {"Retry-After": str(exc.retry_after)})
    except web.HTTPRequestEntityTooLarge:
        return error_response(ProtocolError("body", f"request body larger than {request.client_max_size} bytes", 413))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ProtocolError("path" if exc.status == 404 else "method", exc.reason, exc.status))
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(ProtocolError("", "internal error", 500))


def identity_of(request: web.Request) -> str | None:
    return peer_identity(request.transport.get_extra_info("ssl_object") if request.transport else None)


def check_identity(auth_hash: str, identity: str | None) -> None:
    """A client with a certificate acts only as the identity its certificate proves."""
    if identity is not None and auth_hash != identity:
        raise ProtocolError("authHash", "does not match the client certificate", 403)


def create_app(broker: Broker) -> web.Application:
    config = broker.config
    app = web.Application(client_max_size=config.max_body, middlewares=[errors])

    async def publish(request: web.Request) -> web.Response:
        raw = await request.read()
        if request.content_type in BATCH_TYPES:
            offsets = await broker.ingest.append(parse_publication_batch(raw))
            return json_response({"ids": [str(o) for o in offsets]})
        offsets = await broker.ingest.append([parse_publication(raw)])
        return json_response({"id": str(offsets[0])})

    async def subscribe(request: web.Request) -> web.Response:
        identity = identity_of(request)
        req = parse_subscribe(await request.read(), identity)
        check_identity(req.auth_hash, identity)
        try:
            check_satisfiable([Predicate(*p) for p in req.predicates])
        except Unsatisfiable as exc:
            raise ProtocolError("data", str(exc)) from None
        sub_id = req.subscription_id or uuid.uuid4().hex
        store = broker.threads.store
        try:
            await broker.threads.write(store.put_subscription, sub_id, req.auth_hash, orjson.dumps(req.predicates))
        except NotOwner:
            raise ProtocolError("subscriptionId", "belongs to another client", 403) from None
        return json_response(
            {
                "host": config.hostname,
                "port": config.tcp,
                "ws-port": config.ws,
                "wsport": config.ws,
                "subscriptionId": sub_id,
            }
        )

    async def unsubscribe(request: web.Request) -> web.Response:
        identity = identity_of(request)
        req = parse_unsubscribe(await request.read(), identity)
        check_identity(req.auth_hash, identity)
        store = broker.threads.store
        try:
            await broker.threads.write(store.remove_subscription, req.subscription_id, req.auth_hash)
        except UnknownSubscription:
            raise ProtocolError("subscriptionId", "unknown subscription", 404) from None
        except NotOwner:
            raise ProtocolError("subscriptionId", "belongs to another client", 403) from None
        await broker.hub.kick(req.subscription_id, ProtocolError("subscriptionId", "unsubscribed", 410).to_json())
        return json_response({"subscriptionId": req.subscription_id})

    async def health(request: web.Request) -> web.Response:
        return json_response(broker.health())

    async def ready(request: web.Request) -> web.Response:
        state = broker.health()
        return json_response(state, 200 if state["pipeline"] == "running" else 503)

    app.router.add_post("/publish", publish)
    app.router.add_post("/subscribe", subscribe)
    app.router.add_post("/unsubscribe", unsubscribe)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    return app
