"""The channel of an edge broker (SPEC §9): the active subscriptions that its announcement could serve.

An edge broker connects to a delivery port naming its announcement instead of a subscription. It
gets every active subscription whose constraints can hold together with the announcement's (and,
with authorization on, with one of the subscriber's rules: a subscriber the rules would deny does not
make an edge sensor work), as `{"subscribe": ID, "data": [[key, op, value], ...]}` lines, then a
`{"synced": OFFSET}` line; afterwards the changes, as they are logged, including `{"unsubscribe":
ID}` for subscriptions that went or no longer could be served. IDs are the subscriptions' numbers, so
the edge learns what is wanted, not who wants it. Revoking the announcement closes the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import orjson

from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.matching.stored import decode_subscription
from veil.protocol import Handshake, ProtocolError
from veil.security.identity import Credentials

if TYPE_CHECKING:
    from veil.gateway.server import Broker

POLL = 0.2  # seconds between looks at the log for subscription changes

Send = Callable[[list[bytes]], Awaitable[None]]
Close = Callable[[bytes | None], Awaitable[None]]
Receive = Callable[[], Awaitable[bytes | str | None]]


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
    def __init__(self, broker: Broker, announcement_id: str, announced: list[Predicate], send: Send) -> None:
        self.broker = broker
        self.announcement_id = announcement_id
        self.announced = announced
        self.send = send
        self.sent: dict[str, int] = {}  # subscription id -> the number the edge knows it by
        self.offset = 0

    def _rules(self, owner: str) -> Sequence[Sequence] | None:
        return self.broker.registry.rules_of(owner) if self.broker.config.with_authorization else None

    def _changes(self, dropped: list[str], added: list[tuple[str, int, str, bytes]]) -> list[bytes]:
        lines = [
            orjson.dumps({"unsubscribe": f"s{self.sent.pop(sub_id)}"}) for sub_id in dropped if sub_id in self.sent
        ]
        for sub_id, number, owner, body in added:
            predicates, _ = decode_subscription(body)
            if could_serve(self.announced, predicates, self._rules(owner)):
                self.sent[sub_id] = number
                lines.append(orjson.dumps({"subscribe": f"s{number}", "data": [list(p) for p in predicates]}))
        return lines

    async def follow(self) -> None:
        threads = self.broker.threads
        store = threads.store
        self.offset = await threads.read(store.head_offset)
        lines = self._changes([], await threads.read(store.subscriptions_at, self.offset))
        await self.send([*lines, orjson.dumps({"synced": self.offset})])
        while True:
            await asyncio.sleep(POLL)
            head = await threads.read(store.head_offset)
            if head > self.offset:
                dropped, added = await threads.read(store.subscription_changes, self.offset, head)
                self.offset = head
                lines = self._changes(dropped, added)
                if lines:
                    await self.send(lines)


async def run_edge(
    broker: Broker, handshake: Handshake, identity: str | None, send: Send, close: Close, receive: Receive
) -> None:
    client = broker.auth.identify(Credentials(identity, handshake.token, handshake.auth_hash))
    found = await broker.threads.read(broker.threads.store.announcement, handshake.announcement_id)
    if found is None:
        raise ProtocolError("announcementId", "unknown announcement", 404)
    owner, body = found
    if owner != client:
        raise ProtocolError("authHash", "not the owner of this announcement", 403)
    channel = EdgeChannel(broker, handshake.announcement_id, [Predicate(*p) for p in orjson.loads(body)], send)
    follower = asyncio.create_task(channel.follow())
    closing = broker.edges.setdefault(handshake.announcement_id, {})
    closing[id(channel)] = close
    try:
        while not follower.done():  # the edge only ever closes its side; anything it sends is ignored
            reading = asyncio.create_task(receive())
            done, _ = await asyncio.wait({reading, follower}, return_when=asyncio.FIRST_COMPLETED)
            if reading not in done:
                reading.cancel()
                break
            if reading.result() is None:
                break
    finally:
        closing.pop(id(channel), None)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await follower
