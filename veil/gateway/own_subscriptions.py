"""A client's view of its own subscriptions: `GET /subscriptions` lists them (paged by id) and `GET
/subscriptions/{id}` shows one. Each `veil subscribe` leaves a subscription behind until it is
removed, so a client must be able to find what it holds; another client's id is answered with the
404 of an unknown one, as everywhere else."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from veil.gateway.context import GATEWAY
from veil.gateway.errors import json_response
from veil.gateway.http import client_of
from veil.matching.stored import decode_subscription
from veil.protocol import ProtocolError
from veil.security.registry import ANONYMOUS

routes = web.RouteTableDef()
PAGE = 1000  # subscriptions per answer unless `limit` asks for fewer or more
MOST = 10_000  # the largest page


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
        terms = [
            {"key": t.key, "weight": t.weight, **({"prefer": t.prefer} if t.target is None else {"target": t.target})}
            for t in stored.topk.terms
        ]
        doc["topk"] = {"k": stored.topk.k, "w": stored.topk.window, "score": terms}
    return doc


def _owner(request: web.Request) -> str:
    """Who asks; anonymous clients are refused: they share one identity, and a list would hand every
    one of them the random ids the others' subscriptions are kept under."""
    gateway = request.app[GATEWAY]
    owner = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    if owner == ANONYMOUS:
        raise ProtocolError("authHash", "anonymous clients have no subscriptions of their own to list", 403)
    return owner


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", str(PAGE))
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MOST):
        raise ProtocolError("limit", f"a whole number from 1 to {MOST}")
    return int(text)


@routes.get("/subscriptions")
async def listed(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    owner = _owner(request)
    limit, after = _limit(request), request.query.get("after", "")
    rows = await gateway.threads.read(gateway.threads.store.owned_subscriptions, owner, after, limit + 1)
    page = [described(*row) for row in rows[:limit]]
    more = len(rows) > limit
    return json_response({"subscriptions": page, "next": page[-1]["subscriptionId"] if more else None})


@routes.get("/subscriptions/{id}")
async def shown(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    owner = _owner(request)
    sub_id = request.match_info["id"]
    rows = await gateway.threads.read(gateway.threads.store.owned_subscriptions, owner, "", 1, sub_id)
    if not rows:
        raise ProtocolError("subscriptionId", "no such subscription of yours", 404)
    return json_response(described(*rows[0]))
