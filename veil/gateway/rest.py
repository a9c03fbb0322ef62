"""REST endpoints of SPEC §2 (/publish, /subscribe, /unsubscribe, /unpublish) and of edge brokers
(/announce, /revoke); the admin API and health are in `admin`. Handlers read the gateway's parts
from `request.app[GATEWAY]`; what they raise is answered by the `errors` middleware."""

from __future__ import annotations

import time
import uuid

import orjson
from aiohttp import web

from veil.gateway.admin import routes as admin_routes
from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.cors import cors
from veil.gateway.dead_letters import routes as dead_letter_routes
from veil.gateway.errors import errors, json_response
from veil.gateway.http import body_of, client_of, current_registry, parsed, principal_of, sized
from veil.gateway.openapi import routes as openapi_routes
from veil.gateway.own_subscriptions import routes as own_subscription_routes
from veil.gateway.publisher_rules import routes as publisher_rule_routes
from veil.gateway.queue_bounds import subscriber_bounds
from veil.gateway.scope_keys import routes as scope_key_routes
from veil.gateway.webhook_requests import check_endpoint
from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.matching.stored import encode_subscription
from veil.monitoring.dashboard import routes as dashboard_routes
from veil.protocol import (
    ProtocolError,
    SubscribeRequest,
    keyed,
    parse_announce,
    parse_publication,
    parse_publication_batch,
    parse_revoke,
    parse_subscribe,
    parse_unpublish,
    parse_unsubscribe,
    parse_valid_for,
)
from veil.protocol.limits import Limits
from veil.protocol.publications import Routed
from veil.security import signatures
from veil.security.admission import admit_announcement, admit_publication, admit_subscription
from veil.security.identity import Principal
from veil.security.registry import ANONYMOUS, Registry
from veil.security.webhook_signature import new_secret
from veil.store import NotOwner, Publication, StaleRegistry, Webhook

BATCH_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})
routes = web.RouteTableDef()


def checked_subscription(raw: bytes, limits: Limits) -> tuple[SubscribeRequest, list[Predicate]]:
    """A subscribe request, refused if it can never match, and its predicates."""
    req = parse_subscribe(raw, limits)
    predicates = [Predicate(*p) for p in req.predicates]
    try:
        check_satisfiable(predicates)
    except Unsatisfiable as exc:
        raise ProtocolError("data", str(exc)) from None
    return req, predicates


def admit_publications(registry: Registry, principal: Principal, routed: list[Routed], batch: bool) -> None:
    """Refuse the request if a publication goes into a scope its publisher may not publish into, or
    is sealed under a key that is not the scope's current one (security.admission)."""
    for publication in routed:
        if publication.reserved is None:
            continue
        try:
            admit_publication(registry, principal, publication.reserved)
        except ProtocolError as exc:
            if not batch:
                raise
            raise ProtocolError(f"line {publication.line}: {exc.field}", exc.problem, exc.status) from None


def where_delivered(gateway: Gateway, **reply: object) -> web.Response:
    """The reply to a subscription or an announcement: where its channel is served (SPEC §2.2)."""
    config = gateway.config
    return json_response({"host": config.hostname, "port": config.tcp, "ws-port": config.ws, **reply})


STALE_ATTEMPTS = 4  # attempts at one publish request while other gateways keep changing the registry


@routes.post("/publish")
async def publish(request: web.Request) -> web.Response:
    """Publishers are authenticated and admitted with the registry this gateway holds, and the log
    takes their publications only if no newer version was stored meanwhile (a revocation through
    another gateway): otherwise they are admitted again with the newest one."""
    gateway = request.app[GATEWAY]
    for _ in range(STALE_ATTEMPTS - 1):
        try:
            return await _publish(request, gateway, gateway.registry.version)
        except StaleRegistry:
            await gateway.registry.fresh()
    return await _publish(request, gateway, None)  # the registry keeps changing: the freshest look decides


async def _publish(request: web.Request, gateway: Gateway, registry: int | None) -> web.Response:
    limits = gateway.limits
    principal = principal_of(gateway, request, request.headers.get("X-Auth-Hash"))
    publisher = principal.identity
    raw = await body_of(gateway, request)
    signature = request.headers.get("X-Signature")
    valid_for = parse_valid_for(request.headers.get("X-Valid-For"), limits)
    if request.content_type in BATCH_TYPES:
        if signature is not None:
            raise ProtocolError("X-Signature", "sign publications one per request, not a batch")
        routed = await parsed(gateway, raw, parse_publication_batch, limits, gateway.config.max_pending)
        keys = _keys(principal, keyed(routed, request.headers.get("Idempotency-Key"), batch=True))
        admit_publications(gateway.registry.current, principal, routed, batch=True)
        batch = [Publication(r.body, publisher, valid_for=valid_for, key=k) for r, k in zip(routed, keys, strict=True)]
        offsets = await gateway.ingest.append(batch, registry)
        gateway.metrics.publications.inc(len(offsets))
        return json_response({"ids": [str(o) for o in offsets]})
    one = await parsed(gateway, raw, parse_publication, limits)
    (key,) = _keys(principal, keyed([one], request.headers.get("Idempotency-Key"), batch=False))
    admit_publications(gateway.registry.current, principal, [one], batch=False)
    body = one.body
    key_id = None
    if signature is not None:
        if body != raw:
            raise ProtocolError("X-Signature", "sign a raw JSON object sent byte for byte (other forms are converted)")
        key_id = request.headers.get("X-Key-Id")
        signatures.check(gateway.registry.current.keys.get(publisher, {}), key_id, signature, raw)
    offsets = await gateway.ingest.append([Publication(body, publisher, key_id, signature, valid_for, key)], registry)
    gateway.metrics.publications.inc()
    return json_response({"id": str(offsets[0])})


def _keys(principal: Principal, keys: list[str | None]) -> list[str | None]:
    """Idempotency keys are their publisher's own: clients without credentials share one identity,
    where one could take another's key and have its publications answered as repeats, so theirs are
    not remembered."""
    return [None] * len(keys) if principal.identity == ANONYMOUS else keys


@routes.post("/unpublish")
async def unpublish(request: web.Request) -> web.Response:
    """Withdraw a still-valid publication: later subscriptions do not get it (SPEC §2.5)."""
    gateway = request.app[GATEWAY]
    req = parse_unpublish(await body_of(gateway, request))
    publisher = client_of(gateway, request, req.auth_hash or request.headers.get("X-Auth-Hash"))
    await gateway.threads.write(gateway.threads.store.cancel_publication, req.publication, publisher)
    return json_response({"id": str(req.publication)})


@routes.post("/subscribe")
async def subscribe(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    raw = await body_of(gateway, request)
    req, predicates = await parsed(gateway, raw, checked_subscription, gateway.limits)
    principal = principal_of(gateway, request, req.auth_hash)
    owner = principal.identity
    if req.topk is not None and gateway.config.partition_mode == "publications":
        raise ProtocolError("topk", "top-k subscriptions need the broker's --partition-mode subscriptions")
    if req.since is not None:
        await _check_since(gateway, owner, req.since)
    registry = gateway.registry.current
    admitted = await sized(gateway, len(raw), admit_subscription, registry, principal, predicates, req.scope)
    body = encode_subscription(req.predicates, req.topk, req.scope, admitted, req.since)
    sub_id = req.subscription_id or uuid.uuid4().hex
    most = gateway.config.max_client_subscriptions
    bounds = None if req.limits is None else subscriber_bounds(req.limits, gateway.config)
    webhook = None if req.webhook is None else await _webhook(gateway, req, predicates, owner)
    store = gateway.threads.store
    most_webhooks = gateway.config.max_client_webhooks
    await gateway.threads.write(
        store.put_subscription, sub_id, owner, body, most, bounds, req.since, webhook, most_webhooks
    )
    gateway.webhooks.changed(sub_id, webhook is not None)
    if webhook is not None:
        return json_response({"subscriptionId": sub_id, "webhookSecret": webhook.secret})
    return where_delivered(gateway, wsport=gateway.config.ws, subscriptionId=sub_id)


async def _webhook(gateway: Gateway, req: SubscribeRequest, predicates: list[Predicate], owner: str) -> Webhook:
    """A subscription's webhook, with a new secret (its owner is told it once, in the answer). Its
    deliveries are made with no credentials of the owner's at hand, so the registry alone must admit
    it (a token's claims last no longer than the token), and its endpoint must be where the operator
    lets requests go."""
    assert req.webhook is not None
    try:
        admit_subscription(gateway.registry.current, Principal(owner), predicates, req.scope)
    except ProtocolError as exc:
        problem = f"delivered without your credentials: the registry alone must admit it ({exc.field}: {exc.problem})"
        raise ProtocolError("webhook", problem, 403) from None
    await check_endpoint(req.webhook.url, gateway.config.webhook_networks, gateway.webhooks.names())
    return Webhook(req.webhook.url, new_secret(), req.webhook.batch)


async def _check_since(gateway: Gateway, owner: str, since: int) -> None:
    """A replay reaches back no further than the log keeps publications (an earlier `since` would
    silently miss what was dropped) nor reads more than `--max-replay` entries, and a client has one
    at a time in the pipeline: a replay is matched inside a matching round, which it holds up."""
    retention = gateway.config.retention
    if not retention:
        raise ProtocolError("since", "this broker keeps no publications to replay (its --retention is 0)")
    if since < time.time() * 1000 - retention * 1000:  # (one later than now replays nothing: clocks differ)
        raise ProtocolError("since", f"before what the log keeps: at most {retention:g} s ago (--retention)")
    store, most = gateway.threads.store, gateway.config.max_replay
    entries = await gateway.threads.read(store.logged_since, since)
    if entries > most:
        raise ProtocolError("since", f"about {entries} log entries to replay; at most {most} (--max-replay)", 413)
    if await gateway.threads.read(store.replaying, owner):
        raise ProtocolError("since", "a replay of yours is still being matched: subscribe again once it is", 429)


@routes.post("/unsubscribe")
async def unsubscribe(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    req = parse_unsubscribe(await body_of(gateway, request), gateway.limits)
    owner = client_of(gateway, request, req.auth_hash)
    await gateway.threads.write(gateway.threads.store.remove_subscription, req.subscription_id, owner)
    gateway.hub.kick(req.subscription_id, ProtocolError("subscriptionId", "unsubscribed", 410).to_json())
    return json_response({"subscriptionId": req.subscription_id})


@routes.post("/announce")
async def announce(request: web.Request) -> web.Response:
    """An edge broker announces what its publishers can produce (SPEC §9)."""
    gateway = request.app[GATEWAY]
    raw = await body_of(gateway, request)
    req = await parsed(gateway, raw, parse_announce, gateway.limits)
    principal = principal_of(gateway, request, req.auth_hash)
    owner = principal.identity
    announced = [Predicate(*p) for p in req.predicates]
    if gateway.config.with_authorization:  # off (--dev): anyone may announce, as anyone receives anything
        await sized(gateway, len(raw), admit_announcement, gateway.registry.current, principal, announced)
    ann_id = req.announcement_id or uuid.uuid4().hex
    try:
        await gateway.threads.write(gateway.threads.store.put_announcement, ann_id, owner, orjson.dumps(req.predicates))
    except NotOwner:  # ids are global: one someone else holds can only be refused as taken
        raise ProtocolError("announcementId", "belongs to another client", 403) from None
    return where_delivered(gateway, announcementId=ann_id)


@routes.post("/revoke")
async def revoke(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    auth_hash, ann_id = parse_revoke(await body_of(gateway, request))
    owner = client_of(gateway, request, auth_hash)
    await gateway.threads.write(gateway.threads.store.remove_announcement, ann_id, owner)
    await gateway.edges.close_all(ann_id, ProtocolError("announcementId", "revoked", 410).to_json())
    return json_response({"announcementId": ann_id})


def create_app(gateway: Gateway) -> web.Application:
    middlewares = [cors(gateway.config.cors_origin, gateway.config.port), errors, current_registry]
    app = web.Application(client_max_size=gateway.config.max_body, middlewares=middlewares)
    app[GATEWAY] = gateway
    app.add_routes(routes)
    app.add_routes(admin_routes)
    app.add_routes(scope_key_routes)
    app.add_routes(publisher_rule_routes)
    app.add_routes(own_subscription_routes)
    app.add_routes(dead_letter_routes)
    app.add_routes(openapi_routes)
    app.add_routes(dashboard_routes)
    return app
