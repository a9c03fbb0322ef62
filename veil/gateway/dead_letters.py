"""A subscription's dead letters over REST: read a page at a time, replayed (queued again, in their
order) or purged, by the subscription's owner or by an admin of the registry. Another client's
subscription is answered as none, as everywhere else."""

from __future__ import annotations

import asyncio

from aiohttp import web

from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.errors import json_response
from veil.gateway.http import body_of
from veil.gateway.own_subscriptions import identifier, owner_of
from veil.protocol import ProtocolError
from veil.protocol.envelope import fields
from veil.protocol.limits import load_json
from veil.store import DeadLetter

routes = web.RouteTableDef()
PAGE = 100  # dead letters per answer unless `limit` asks for fewer or more
MOST = 1000  # the largest `limit`
PAGE_BYTES = 1 << 20  # a page ends before its publications pass this many bytes (one at least)
SEQ_DIGITS = 18  # a seq fits int64


async def _subscription(request: web.Request) -> tuple[Gateway, str, int]:
    """The gateway, the subscription's id and its number, if the caller owns it or is an admin."""
    gateway = request.app[GATEWAY]
    caller = owner_of(request)
    sub_id = identifier(request.match_info["id"], "subscriptionId")
    store = gateway.threads.store
    number = await gateway.threads.read(store.subscription_number, sub_id, caller)
    if number is None and caller in gateway.registry.current.admins:
        number = await gateway.threads.read(store.subscription_number, sub_id)
    if number is None:
        raise ProtocolError("subscriptionId", "no such subscription of yours", 404)
    return gateway, sub_id, number


def _seq(text: str | None, field: str) -> int | None:
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= SEQ_DIGITS):
        raise ProtocolError(field, "the seq of a dead letter: a whole number")
    return int(text)


def _line(letter: DeadLetter) -> bytes:
    """A dead letter as its subscriber would have been delivered it (the envelope's members), with
    why and when it left the queue."""
    members = fields(letter.origin._replace(copy_of=letter.pub))
    return b'{"seq":%d,"reason":"%s","at":%d,"logged":%d,%s,"publication":%s}' % (
        letter.seq, letter.reason.encode(), letter.at, letter.logged, members, letter.body
    )  # fmt: skip


def _page(letters: list[DeadLetter], following: int | None) -> bytes:
    listed = b",".join(_line(letter) for letter in letters)
    return b'{"deadLetters":[%s],"next":%s}' % (listed, b"null" if following is None else b"%d" % following)


@routes.get("/subscriptions/{id}/dead-letters")
async def listed(request: web.Request) -> web.Response:
    gateway, _, number = await _subscription(request)
    after = _seq(request.query.get("after"), "after") or 0
    text = request.query.get("limit", str(PAGE))
    if not (len(text) <= 4 and text.isascii() and text.isdigit() and 1 <= int(text) <= MOST):
        raise ProtocolError("limit", f"a whole number from 1 to {MOST}")
    limit = int(text)
    store = gateway.threads.store
    letters, following = await gateway.threads.read(store.dead_letters, number, after, limit, PAGE_BYTES)
    body = await asyncio.get_running_loop().run_in_executor(gateway.parsing, _page, letters, following)
    return web.Response(body=body, content_type="application/json")


@routes.post("/subscriptions/{id}/dead-letters/replay")
async def replayed(request: web.Request) -> web.Response:
    """Queue the dead letters again (those up to `upto`, all by default; REPLAY_MOST a request), in
    their order, after whatever the subscription has queued: the pipeline queues them, under the
    registry in force."""
    gateway, sub_id, number = await _subscription(request)
    raw = await body_of(gateway, request)
    doc = load_json(raw, "body", gateway.limits) if raw.strip() else {}
    if not isinstance(doc, dict):
        raise ProtocolError("body", 'expected a JSON object: {"upto": SEQ} or {}')
    upto = doc.get("upto")
    if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto < 10**SEQ_DIGITS):
        raise ProtocolError("upto", "the seq of a dead letter: a whole number")
    count, left = await gateway.threads.write(gateway.threads.store.replay_dead_letters, sub_id, number, upto)
    return json_response({"replayed": count, "left": left})


@routes.delete("/subscriptions/{id}/dead-letters")
async def purged(request: web.Request) -> web.Response:
    gateway, _, number = await _subscription(request)
    upto = _seq(request.query.get("upto"), "upto")
    count = await gateway.threads.write(gateway.threads.store.purge_dead_letters, number, upto)
    return json_response({"purged": count})
