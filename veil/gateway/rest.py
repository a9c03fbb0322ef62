"""REST endpoints of SPEC §2 (/publish, /subscribe, /unsubscribe), the registry's admin API, /health
and /ready.

Every client mistake becomes a JSON error naming the field (never a 500); overload becomes 503 with
Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import orjson
from aiohttp import web

from veil.gateway.admission import Admission
from veil.gateway.ingest import Overloaded
from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.matching.stored import encode_subscription
from veil.protocol import (
    ProtocolError,
    SubscribeRequest,
    parse_announce,
    parse_publication,
    parse_publication_batch,
    parse_revoke,
    parse_subscribe,
    parse_unpublish,
    parse_unsubscribe,
    parse_valid_for,
)
from veil.protocol.envelope import origin_fields
from veil.protocol.limits import Limits, load_json
from veil.security import signatures
from veil.security.identity import Credentials
from veil.security.registry import parse_registry
from veil.security.tls import peer_identity
from veil.store import (
    KIND_CANCEL,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    NotOwner,
    Publication,
    StoreUnavailable,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)

if TYPE_CHECKING:
    from veil.gateway.server import Broker

log = logging.getLogger("veil.gateway")
BATCH_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})
PARSE_OFF_LOOP = 64 * 1024  # bodies larger than this are parsed on a thread, so the loop serves others meanwhile
STORE_RETRY_AFTER = 5  # seconds, when the store cannot take writes
KIND_NAMES = {
    KIND_PUBLICATION: "publication", KIND_SUBSCRIBE: "subscription", KIND_UNSUBSCRIBE: "unsubscription",
    KIND_REGISTRY: "registry", KIND_TICK: "tick", KIND_CANCEL: "unpublication",
}  # fmt: skip
T = TypeVar("T")


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def error_response(error: ProtocolError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=error.to_json(), status=error.status, content_type="application/json", headers=headers)


ADMISSION = web.AppKey("admission", Admission)


@web.middleware
async def errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Every exception becomes a status (never a 500 for a client's mistake). While a request is being
    handled its connection is not a waiting one; between requests a keep-alive connection counts as
    waiting again (untimed: the keep-alive timer closes it), so that the bound on waiting connections
    also covers those that send one request and idle."""
    admission = request.app[ADMISSION]
    connection = request.protocol
    admission.settle(connection)
    try:
        return await handler(request)
    except ProtocolError as exc:
        return error_response(exc)
    except Overloaded as exc:
        return error_response(ProtocolError("", str(exc), 503), {"Retry-After": str(exc.retry_after)})
    except StoreUnavailable as exc:
        log.error("store unavailable on %s %s: %s", request.method, request.path, exc)
        return error_response(
            ProtocolError("", f"the broker's store cannot take writes now ({exc}); nothing was stored", 503),
            {"Retry-After": str(STORE_RETRY_AFTER)},
        )
    except web.HTTPRequestEntityTooLarge:
        return error_response(ProtocolError("body", f"request body larger than {request.client_max_size} bytes", 413))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ProtocolError("path" if exc.status == 404 else "method", exc.reason, exc.status))
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(ProtocolError("", "internal error", 500))
    finally:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            admission.admit(connection, transport.close, timed=False)


def identity_of(request: web.Request) -> str | None:
    return peer_identity(request.transport.get_extra_info("ssl_object") if request.transport else None)


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProtocolError("Authorization", "expected 'Bearer <token>'", 401)
    return token.strip()


def client_of(broker: Broker, request: web.Request, claimed: str | None) -> str:
    """Who sent the request: what its certificate or token proves, or the static hash it claims where
    the operator accepts those."""
    return broker.auth.identify(Credentials(identity_of(request), bearer_token(request), claimed))


async def body_of(broker: Broker, request: web.Request) -> bytes:
    """The request's body, within the read timeout: a client that stops sending mid-body holds a
    connection, not the broker."""
    if request.content.is_eof():  # all of it arrived with the headers, as nearly always: no timer needed
        return await request.read()
    try:
        async with asyncio.timeout(broker.config.read_timeout):
            return await request.read()
    except TimeoutError:
        raise ProtocolError("body", f"not received within {broker.config.read_timeout:g} s", 408) from None


async def parsed(broker: Broker, raw: bytes, parse: Callable[..., T], *args: object) -> T:
    """`parse(raw, *args)`, on the parsing thread when the body is large."""
    if len(raw) <= PARSE_OFF_LOOP:
        return parse(raw, *args)
    return await asyncio.get_running_loop().run_in_executor(broker.parsing, parse, raw, *args)


def checked_subscription(raw: bytes, limits: Limits) -> tuple[SubscribeRequest, bytes]:
    """A subscribe request, refused if it can never match, and the body it is logged with."""
    req = parse_subscribe(raw, limits)
    try:
        check_satisfiable([Predicate(*p) for p in req.predicates])
    except Unsatisfiable as exc:
        raise ProtocolError("data", str(exc)) from None
    return req, encode_subscription(req.predicates, req.topk)


def create_app(broker: Broker) -> web.Application:
    config = broker.config
    limits = broker.limits

    app = web.Application(client_max_size=config.max_body, middlewares=[errors])
    app[ADMISSION] = broker.admission

    async def publish(request: web.Request) -> web.Response:
        publisher = client_of(broker, request, request.headers.get("X-Auth-Hash"))
        raw = await body_of(broker, request)
        signature = request.headers.get("X-Signature")
        valid_for = parse_valid_for(request.headers.get("X-Valid-For"), limits)
        if request.content_type in BATCH_TYPES:
            if signature is not None:
                raise ProtocolError("X-Signature", "sign publications one per request, not a batch")
            meta = origin_fields(publisher)
            bodies = await parsed(broker, raw, parse_publication_batch, limits, config.max_pending)
            offsets = await broker.ingest.append([Publication(body, publisher, meta, valid_for) for body in bodies])
            return json_response({"ids": [str(o) for o in offsets]})
        body = await parsed(broker, raw, parse_publication, limits)
        key_id = request.headers.get("X-Key-Id")
        if signature is not None:
            if body != raw:
                raise ProtocolError(
                    "X-Signature", "sign a raw JSON object sent byte for byte (other forms are converted)"
                )
            signatures.check(broker.registry.keys.get(publisher, {}), key_id, signature, raw)
        meta = origin_fields(publisher, key_id, signature)
        offsets = await broker.ingest.append([Publication(body, publisher, meta, valid_for)])
        return json_response({"id": str(offsets[0])})

    async def unpublish(request: web.Request) -> web.Response:
        """Withdraw a still-valid publication: later subscriptions do not get it (SPEC §2.5)."""
        req = parse_unpublish(await body_of(broker, request))
        publisher = client_of(broker, request, req.auth_hash or request.headers.get("X-Auth-Hash"))
        try:
            await broker.threads.write(broker.threads.store.cancel_publication, req.publication, publisher)
        except UnknownPublication:
            raise ProtocolError("id", "no publication with this id is still valid", 404) from None
        except NotOwner:
            raise ProtocolError("id", "published by another client", 403) from None
        return json_response({"id": str(req.publication)})

    async def subscribe(request: web.Request) -> web.Response:
        req, body = await parsed(broker, await body_of(broker, request), checked_subscription, limits)
        owner = client_of(broker, request, req.auth_hash)
        if req.topk is not None and config.partition_mode == "publications":
            raise ProtocolError("topk", "top-k/w subscriptions need the broker's --partition-mode subscriptions")
        sub_id = req.subscription_id or uuid.uuid4().hex
        store = broker.threads.store
        try:
            await broker.threads.write(store.put_subscription, sub_id, owner, body)
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
        req = parse_unsubscribe(await body_of(broker, request), limits)
        owner = client_of(broker, request, req.auth_hash)
        store = broker.threads.store
        try:
            await broker.threads.write(store.remove_subscription, req.subscription_id, owner)
        except UnknownSubscription:
            raise ProtocolError("subscriptionId", "unknown subscription", 404) from None
        except NotOwner:
            raise ProtocolError("subscriptionId", "belongs to another client", 403) from None
        await broker.hub.kick(req.subscription_id, ProtocolError("subscriptionId", "unsubscribed", 410).to_json())
        return json_response({"subscriptionId": req.subscription_id})

    async def announce(request: web.Request) -> web.Response:
        """An edge broker announces what its publishers can produce (SPEC §9)."""
        req = await parsed(broker, await body_of(broker, request), parse_announce, limits)
        owner = client_of(broker, request, req.auth_hash)
        ann_id = req.announcement_id or uuid.uuid4().hex
        try:
            await broker.threads.write(
                broker.threads.store.put_announcement, ann_id, owner, orjson.dumps(req.predicates)
            )
        except NotOwner:
            raise ProtocolError("announcementId", "belongs to another client", 403) from None
        return json_response(
            {"host": config.hostname, "port": config.tcp, "ws-port": config.ws, "announcementId": ann_id}
        )

    async def revoke(request: web.Request) -> web.Response:
        auth_hash, ann_id = parse_revoke(await body_of(broker, request))
        owner = client_of(broker, request, auth_hash)
        try:
            await broker.threads.write(broker.threads.store.remove_announcement, ann_id, owner)
        except UnknownAnnouncement:
            raise ProtocolError("announcementId", "unknown announcement", 404) from None
        except NotOwner:
            raise ProtocolError("announcementId", "belongs to another client", 403) from None
        revoked = ProtocolError("announcementId", "revoked", 410).to_json()
        for close in list(broker.edges.pop(ann_id, {}).values()):
            await close(revoked)
        return json_response({"announcementId": ann_id})

    def admin(request: web.Request) -> str:
        user = client_of(broker, request, request.headers.get("X-Auth-Hash"))
        if user not in broker.registry.admins:
            raise ProtocolError("authHash", "not an administrator of this broker's registry", 403)
        return user

    async def registry(request: web.Request) -> web.Response:
        """The admin API: read or replace the registry (SPEC §6); only its admins may."""
        admin(request)
        if request.method == "PUT":
            raw = await body_of(broker, request)
            document = await parsed(broker, raw, load_json, "body", limits)
            await broker.replace_registry(parse_registry(document))
        return web.Response(body=broker.registry.to_json(), content_type="application/json")

    async def quarantine(request: web.Request) -> web.Response:
        """The log entries the pipeline set aside, for an admin to look at (and drop)."""
        admin(request)
        records = await broker.threads.read(broker.threads.store.quarantine)
        return json_response(
            {
                "entries": [
                    {
                        "offset": r.offset, "kind": KIND_NAMES.get(r.kind, str(r.kind)), "subscriptionId": r.sub_id,
                        "owner": r.owner, "error": r.error, "time": r.time,
                        "body": None if r.body is None else r.body.decode(errors="replace"),
                    }
                    for r in records
                ]
            }
        )  # fmt: skip

    async def drop_quarantined(request: web.Request) -> web.Response:
        """Drop a quarantined entry: a publication stays undelivered, a subscription is removed (its
        owner subscribes anew), and the entry leaves the quarantine and the health report."""
        admin(request)
        text = request.match_info["offset"]
        if not (text.isascii() and text.isdigit() and len(text) < 19):
            raise ProtocolError("offset", "the offset of a quarantined entry")
        store = broker.threads.store
        record = await broker.threads.read(store.quarantined_at, int(text))
        # the subscription goes only if the quarantined version is still the live one (not replaced)
        live = record is not None and record.kind == KIND_SUBSCRIBE and record.sub_id is not None and (
            await broker.threads.read(store.subscription_refusal, record.sub_id) is not None
        )  # fmt: skip
        if record is None or not await broker.threads.write(store.release_quarantined, record.offset):
            raise ProtocolError("offset", "no quarantined entry at this offset", 404)
        if live and record.owner is not None:
            with contextlib.suppress(UnknownSubscription, NotOwner):  # removed by its owner meanwhile
                await broker.threads.write(store.remove_subscription, record.sub_id, record.owner)
        return json_response({"offset": record.offset, "dropped": KIND_NAMES.get(record.kind, str(record.kind))})

    async def health(request: web.Request) -> web.Response:
        return json_response(broker.health())

    async def ready(request: web.Request) -> web.Response:
        return json_response(broker.health(), 200 if broker.ready else 503)

    app.router.add_post("/publish", publish)
    app.router.add_post("/subscribe", subscribe)
    app.router.add_post("/unsubscribe", unsubscribe)
    app.router.add_post("/unpublish", unpublish)
    app.router.add_post("/announce", announce)
    app.router.add_post("/revoke", revoke)
    app.router.add_get("/admin/registry", registry)
    app.router.add_put("/admin/registry", registry)
    app.router.add_get("/admin/quarantine", quarantine)
    app.router.add_delete("/admin/quarantine/{offset}", drop_quarantined)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    return app
