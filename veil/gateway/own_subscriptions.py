"""A client's view of its own subscriptions: `GET /subscriptions` lists them (paged by id) and `GET
/subscriptions/{id}` shows one. Each `veil subscribe` leaves a subscription behind until it is
removed, so a client must be able to find what it holds; another client's id is answered with the
404 of an unknown one, as everywhere else."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from veil.gateway.context import GATEWAY
from veil.gateway.http import client_of
from veil.matching.stored import decode_subscription
from veil.protocol import ProtocolError
from veil.protocol.subscriptions import MAX_ID_LENGTH
from veil.security.registry import ANONYMOUS
from veil.store import GatewayStore

routes = web.RouteTableDef()
PAGE = 1000  # subscriptions per answer unless `limit` asks for fewer or more
MOST = 10_000  # the largest `limit`
PAGE_BYTES = 1 << 20  # a page ends before its stored subscriptions pass this many bytes, whatever `limit` says


def described(sub_id: str, created: int, body: bytes) -> dict[str, Any]:
    """A stored subscription in the form /subscribe takes (constraints as key, op, val)."""
    stored = decode_subscription(body)
    doc: dict[str, Any] = {
        "subscriptionId": sub_id,
        "data": [{"key": p.key, "op": p.op, "val": p.value} for p in stored.predicates],
        "created": str(created),
    }
    if stored.scope:
        doc["scope"] = stored.scope
    if stored.topk is not None:
        doc["topk"] = stored.topk
    if stored.since is not None:
        doc["since"] = stored.since
    return doc


def page(store: GatewayStore, owner: str, after: str, limit: int) -> tuple[list[tuple[str, int, bytes]], str | None]:
    """Up to `limit` of the owner's subscriptions after `after`, fewer once they would pass
    PAGE_BYTES (one at least), and the `next` to list the rest from (None when there is none)."""
    sizes = store.owned_sizes(owner, after, limit + 1)
    taken = size = 0
    for _, length in sizes[:limit]:
        if taken and size + length > PAGE_BYTES:
            break
        taken, size = taken + 1, size + length
    rows = store.owned_subscriptions(owner, after, taken) if taken else []
    return rows, rows[-1][0] if rows and len(sizes) > taken else None


def _answer(rows: list[tuple[str, int, bytes]], following: str | None) -> bytes:
    return orjson.dumps({"subscriptions": [described(*row) for row in rows], "next": following})


def owner_of(request: web.Request) -> str:
    """Who asks; anonymous clients are refused: they share one identity, and a list would hand every
    one of them the random ids the others' subscriptions are kept under."""
    gateway = request.app[GATEWAY]
    owner = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    if owner == ANONYMOUS:
        raise ProtocolError("authHash", "anonymous clients have no subscriptions of their own to look at", 403)
    return owner


def identifier(text: str, field: str) -> str:
    """An id as /subscribe takes it; anything else could not name a subscription (and some stores
    refuse it outright, as PostgreSQL does a NUL)."""
    if len(text) > MAX_ID_LENGTH or not text.isprintable():
        raise ProtocolError(field, f"a subscription id: at most {MAX_ID_LENGTH} printable characters")
    return text


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", str(PAGE))
    if not (len(text) <= 5 and text.isascii() and text.isdigit() and 1 <= int(text) <= MOST):
        raise ProtocolError("limit", f"a whole number from 1 to {MOST}")
    return int(text)


@routes.get("/subscriptions")
async def listed(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    owner = owner_of(request)
    limit, after = _limit(request), identifier(request.query.get("after", ""), "after")
    rows, following = await gateway.threads.read(page, gateway.threads.store, owner, after, limit)
    # up to a megabyte of subscriptions: decoded and written on the parsing thread, off the event loop
    body = await asyncio.get_running_loop().run_in_executor(gateway.parsing, _answer, rows, following)
    return web.Response(body=body, content_type="application/json")


@routes.get("/subscriptions/{id}")
async def shown(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    owner = owner_of(request)
    sub_id = identifier(request.match_info["id"], "subscriptionId")
    store = gateway.threads.store
    rows = await gateway.threads.read(store.owned_subscriptions, owner, "", 1, sub_id)
    if not rows:
        raise ProtocolError("subscriptionId", "no such subscription of yours", 404)
    body = await asyncio.get_running_loop().run_in_executor(gateway.parsing, lambda: orjson.dumps(described(*rows[0])))
    return web.Response(body=body, content_type="application/json")
