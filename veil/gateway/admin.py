"""The admin API (the registry, SPEC §6; the quarantine) for the registry's admins, and the health
endpoints for anyone."""

from __future__ import annotations

import contextlib

from aiohttp import web

from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.errors import json_response
from veil.gateway.http import body_of, client_of, parsed, sized
from veil.gateway.registry import VERSION_HEADER, base_version
from veil.gateway.scope_keys import keep_scope_keys
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.security.registry import Registry, parse_registry
from veil.store import (
    KIND_CANCEL,
    KIND_PUBLICATION,
    KIND_REDELIVER,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    NotOwner,
    UnknownSubscription,
)

KIND_NAMES = {
    KIND_PUBLICATION: "publication", KIND_SUBSCRIBE: "subscription", KIND_UNSUBSCRIBE: "unsubscription",
    KIND_REGISTRY: "registry", KIND_TICK: "tick", KIND_CANCEL: "unpublication", KIND_REDELIVER: "redelivery",
}  # fmt: skip
routes = web.RouteTableDef()


def admin(gateway: Gateway, request: web.Request) -> str:
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    if user not in gateway.registry.current.admins:
        raise ProtocolError("authHash", "not an administrator of this broker's registry", 403)
    return user


@routes.get("/admin/registry")
@routes.put("/admin/registry")
async def registry(request: web.Request) -> web.Response:
    """Read or replace the registry; only its admins may. A replacement names the version it was made
    from (`X-Registry-Version`, as the GET answered): 409 naming the newest if another change was
    stored since, so that no one's change is undone unseen."""
    gateway = request.app[GATEWAY]
    admin(gateway, request)
    current = gateway.registry
    if request.method == "PUT":
        raw = await body_of(gateway, request)
        document = await parsed(gateway, raw, load_json, "body", gateway.limits)
        replacement = await sized(gateway, len(raw), parse_registry, document)
        if not replacement.admins:
            raise ProtocolError("admins", "the last administrator cannot be removed: name at least one", 409)
        assert isinstance(document, dict)  # parse_registry took it, and it names admins
        base = base_version(request, required=True)

        def replaced(_: Registry, stored: dict) -> None:
            keep_scope_keys(stored, document)
            stored.clear()
            stored.update(document)

        await current.amend(replaced, base)
    headers = {VERSION_HEADER: str(current.version)}
    return web.Response(body=current.body, content_type="application/json", headers=headers)


@routes.get("/admin/quarantine")
async def quarantine(request: web.Request) -> web.Response:
    """The log entries the pipeline set aside, for an admin to look at (and drop)."""
    gateway = request.app[GATEWAY]
    admin(gateway, request)
    records = await gateway.threads.read(gateway.threads.store.quarantine)
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


@routes.delete("/admin/quarantine/{offset}")
async def drop_quarantined(request: web.Request) -> web.Response:
    """Drop a quarantined entry: a publication stays undelivered, a subscription is removed (its
    owner subscribes anew), and the entry leaves the quarantine and the health report."""
    gateway = request.app[GATEWAY]
    admin(gateway, request)
    text = request.match_info["offset"]
    if not (text.isascii() and text.isdigit() and len(text) < 19):
        raise ProtocolError("offset", "the offset of a quarantined entry")
    threads = gateway.threads
    store = threads.store
    record = await threads.read(store.quarantined_at, int(text))
    # the subscription goes only if the quarantined version is still the live one (not replaced)
    live = record is not None and record.kind == KIND_SUBSCRIBE and record.sub_id is not None and (
        await threads.read(store.subscription_refusal, record.sub_id) is not None
    )  # fmt: skip
    if record is None:
        raise ProtocolError("offset", "no quarantined entry at this offset", 404)
    # removed before it leaves the quarantine: until the pipeline passes the removal, a matcher that
    # reloads its state loads whatever is live and not quarantined, fails on it, and sets it aside again
    if live and record.sub_id is not None and record.owner is not None:
        with contextlib.suppress(UnknownSubscription, NotOwner):  # removed by its owner meanwhile
            await threads.write(store.remove_subscription, record.sub_id, record.owner)
    if not await threads.write(store.release_quarantined, record.offset):
        raise ProtocolError("offset", "no quarantined entry at this offset", 404)
    return json_response({"offset": record.offset, "dropped": KIND_NAMES.get(record.kind, str(record.kind))})


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    return json_response(request.app[GATEWAY].health.report())


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus' exposition format, for anyone who can reach the port (like /health)."""
    figures = request.app[GATEWAY].metrics
    return web.Response(body=await figures.exposition(), headers={"Content-Type": figures.content_type})


@routes.get("/ready")
async def ready(request: web.Request) -> web.Response:
    health = request.app[GATEWAY].health
    return json_response(health.report(), 200 if health.ready else 503)
