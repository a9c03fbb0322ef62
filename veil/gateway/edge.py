"""The channel of an edge broker (SPEC §9): the active subscriptions that its announcement could serve.

An edge broker connects to a delivery port naming its announcement instead of a subscription. It
gets every active subscription whose constraints can hold together with the announcement's (and,
with authorization on, with one of the subscriber's rules: a subscriber the rules would deny does not
make an edge sensor work), as `{"subscribe": ID, "data": [[key, op, value], ...]}` lines, then a
`{"synced": OFFSET}` line; afterwards the changes, as they are logged, including `{"unsubscribe":
ID}` for subscriptions that went or no longer could be served. IDs are the subscriptions' numbers, so
the edge learns what is wanted, not who wants it. Revoking the announcement closes the channel.

What an edge learns is as much as its owner could publish to: announcing takes the registry's
`announce` privilege (checked again when the channel opens), and a subscription made in a scope is
shown only to an owner who may publish into that scope (`security.admission`), so that no client
reads the filters of a scope it is outside of.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import orjson

from veil.gateway.channel import Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.matching.stored import decode_subscription
from veil.protocol import Handshake, ProtocolError
from veil.security.admission import admit_announcement, is_member
from veil.security.identity import Principal
from veil.security.scopes import WORLD

POLL = 0.2  # seconds between looks at the log for subscription changes


def could_serve(announced: Sequence[Predicate], wanted: Sequence[Predicate], rules: Sequence[Sequence] | None) -> bool:
    """Whether some publication can satisfy the announcement and the subscription (and one of the
    subscriber's rules, unless `rules` is None: authorization off)."""
    for rule in [()] if rules is None else rules:
        try:
            check_satisfiable([*announced, *wanted, *(Predicate(*p) for p in rule)])
        except Unsatisfiable:
            continue
        return True
    return False


class EdgeChannel:
    def __init__(
        self, gateway: Gateway, announcement_id: str, announced: list[Predicate], principal: Principal, send: Send
    ) -> None:
        self.gateway = gateway
        self.announcement_id = announcement_id
        self.announced = announced
        self.principal = principal  # the announcement's owner, as its credentials on this channel prove
        self.send = send
        self.sent: dict[str, int] = {}  # subscription id -> the number the edge knows it by
        self.offset = 0

    def _rules(self, owner: str) -> Sequence[Sequence] | None:
        gateway = self.gateway
        return gateway.registry.current.rules_of(owner) if gateway.config.with_authorization else None

    def _changes(self, dropped: list[str], added: list[tuple[str, int, str, bytes]]) -> list[bytes]:
        lines = [
            orjson.dumps({"unsubscribe": f"s{self.sent.pop(sub_id)}"}) for sub_id in dropped if sub_id in self.sent
        ]
        for sub_id, number, owner, body in added:
            stored = decode_subscription(body)
            predicates = stored.predicates
            if stored.scope != WORLD and not is_member(self.gateway.registry.current, self.principal, stored.scope):
                continue
            if could_serve(self.announced, predicates, self._rules(owner)):
                self.sent[sub_id] = number
                lines.append(orjson.dumps({"subscribe": f"s{number}", "data": [list(p) for p in predicates]}))
        return lines

    async def _still_admitted(self) -> None:
        """The owner's privilege, checked again whenever something was logged (a registry change among
        it): a channel whose owner may no longer announce this ends with the error line (403)."""
        if self.gateway.config.with_authorization:
            admit_announcement(await self.gateway.registry.fresh(), self.principal, self.announced)

    async def follow(self) -> None:
        threads = self.gateway.threads
        store = threads.store
        self.offset = await threads.read(store.head_offset)
        lines = self._changes([], await threads.read(store.subscriptions_at, self.offset))
        await self.send([*lines, orjson.dumps({"synced": self.offset})])
        while True:
            await asyncio.sleep(POLL)
            head = await threads.read(store.head_offset)
            if head > self.offset:
                await self._still_admitted()
                dropped, added = await threads.read(store.subscription_changes, self.offset, head)
                self.offset = head
                lines = self._changes(dropped, added)
                if lines:
                    await self.send(lines)


async def run_edge(
    gateway: Gateway, handshake: Handshake, principal: Principal, send: Send, close: Close, receive: Receive
) -> None:
    """Follow the subscriptions the announcement could serve until the edge closes its side or the
    announcement is revoked (anything the edge sends is ignored)."""
    ann_id = handshake.announcement_id
    found = await gateway.threads.read(gateway.threads.store.announcement, ann_id)
    if found is None or found[0] != principal.identity:  # someone else's is not told apart from none
        raise ProtocolError("announcementId", "unknown announcement", 404)
    announced = [Predicate(*p) for p in orjson.loads(found[1])]
    if gateway.config.with_authorization:
        admit_announcement(gateway.registry.current, principal, announced)
    client = gateway.hub.quotas.connect(principal.identity)  # an edge channel is a delivery connection
    channel = EdgeChannel(gateway, ann_id, announced, principal, send)
    follower = asyncio.create_task(channel.follow())
    gateway.edges.add(ann_id, id(channel), close)
    try:
        await read_while(follower, receive, lambda message: None)
    finally:
        gateway.hub.quotas.disconnect(client)
        gateway.edges.discard(ann_id, id(channel))
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await follower
