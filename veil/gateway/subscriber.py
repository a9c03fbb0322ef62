"""Who may receive a subscription's deliveries on a delivery connection: its owner, proven by the
handshake's credentials, while the subscription is neither quarantined nor connected through another
gateway, and while those credentials would still admit it (a scope or a filter that a token claim or a
certificate attribute allowed when it was made may be allowed no more); and where its deliveries
resume."""

from __future__ import annotations

import numpy as np

from veil.gateway import membership
from veil.gateway.bundle import Admitted
from veil.gateway.context import Gateway
from veil.gateway.delivery import Unsaved
from veil.gateway.http import sized
from veil.matching.stored import decode_subscription
from veil.protocol import Handshake, ProtocolError
from veil.protocol.errors import unknown
from veil.security.admission import admit_subscription
from veil.security.identity import Principal
from veil.store.base import LiveSubscription


async def admit(gateway: Gateway, handshake: Handshake, principal: Principal, webhook: bool = False) -> list[Admitted]:
    """Check the handshake's subscriptions (its one, or all a multiplexed one names) and claim them,
    all or none; ProtocolError (with the reason to send back) naming the first refused."""
    unsaved = gateway.hub.unsaved()
    return await claim(gateway, handshake, await check(gateway, handshake, principal, webhook), unsaved)


async def check(
    gateway: Gateway, handshake: Handshake, principal: Principal, webhook: bool = False
) -> list[LiveSubscription]:
    """The handshake's subscriptions, each checked as `admit` does (ProtocolError: the first refused).
    The store is asked once for all of them: admitting a connection of a thousand subscriptions costs
    one read, not a thousand. A webhook subscription is delivered by the gateway alone (`webhook`),
    never on a client's connection, where the two would take its deliveries from each other."""
    threads = gateway.threads
    ids = _ids(handshake)
    found = await threads.read(threads.store.live_subscriptions, ids, principal.identity)
    # checking 2,048 large filters takes time a client chose: off the event loop then, as request bodies are
    size = sum(len(live.body) for live in found if live is not None)
    await sized(gateway, size, _check_all, gateway, principal, handshake, ids, found, webhook)
    return [live for live in found if live is not None]  # all are: checked above


async def claim(
    gateway: Gateway, handshake: Handshake, found: list[LiveSubscription], unsaved: Unsaved
) -> list[Admitted]:
    """Claim checked subscriptions for this gateway in one transaction (a thousand claims do not queue
    a thousand writes ahead of everybody's publications), each with where its deliveries resume:
    after its cursor as the store had it when `found` was read, or as the hub had it unsaved before
    (`unsaved`), skipping what a group's members acknowledged past it."""
    threads, hub = gateway.threads, gateway.hub
    store = threads.store
    multiplexed = range(len(handshake.subscription_ids))
    each = [handshake.for_subscription(place) for place in multiplexed] if multiplexed else [handshake]
    numbers = [live.number for live in found]
    try:
        claimed = await membership.claim(gateway, _ids(handshake), numbers)
    except membership.Held as exc:
        raise _naming(handshake, exc.sub_id, exc.error or unknown("subscription")) from None
    try:
        # a resume point past the log's head names nothing: kept, it would hold the subscription's
        # queue (and the log below it) where no delivery moves it, out of reach of the queues' bounds
        resuming = any(one.resume_after is not None for one in each)
        head = await threads.read(store.head_offset) if resuming else 0
        acked = await threads.read(store.acked, numbers)
    except BaseException:
        await membership.release(gateway, _ids(handshake), claimed)
        raise
    # and as the hub has it now: what a connection acknowledged and handed over since is in neither
    later = hub.unsaved()
    admitted = []
    for one, live in zip(each, found, strict=True):
        number = live.number
        start = None if one.resume_after is None else min(one.resume_after, head)
        if start is None:
            saved = max(live.cursor, unsaved.cursors.get(number, 0), later.cursors.get(number, 0))
            start = max(saved, hub.held_cursor(one.subscription_id, number))
        kept = acked.get(number, []) + unsaved.acked.get(number, []) + later.acked.get(number, [])
        skip = np.unique(np.array([pub for pub in kept if pub > start], np.int64))
        admitted.append(Admitted(one.subscription_id, number, start, claimed, skip))
    return admitted


def _ids(handshake: Handshake) -> list[str]:
    return list(handshake.subscription_ids) or [handshake.subscription_id]


def _check_all(
    gateway: Gateway, principal: Principal, handshake: Handshake, ids: list[str], found: list[LiveSubscription | None],
    webhook: bool,
) -> None:  # fmt: skip
    for sub_id, live in zip(ids, found, strict=True):
        try:
            _check(gateway, principal, live, webhook)
        except ProtocolError as exc:
            raise _naming(handshake, sub_id, exc) from None


def _check(gateway: Gateway, principal: Principal, live: LiveSubscription | None, webhook: bool) -> None:
    # one answer for an id nobody holds and one someone else holds: a client learns nothing of others'
    if live is None or (webhook and not live.webhook):
        raise unknown("subscription")
    if live.webhook and not webhook:
        problem = "delivered to its webhook; subscribe again without one to receive it on a connection"
        raise ProtocolError("subscriptionId", problem, 409)
    stored = decode_subscription(live.body)
    try:
        admit_subscription(gateway.registry.current, principal, stored.predicates, stored.scope)
    except ProtocolError as exc:
        problem = f"these credentials no longer admit this subscription ({exc.field}: {exc.problem})"
        raise ProtocolError("subscriptionId", problem, 403) from None
    if live.refusal is not None:
        raise ProtocolError("subscriptionId", f"quarantined by the broker: {live.refusal}", 422)


def _naming(handshake: Handshake, sub_id: str, exc: ProtocolError) -> ProtocolError:
    """A refusal as the handshake's client reads it: on a multiplexed connection, naming which id."""
    if not handshake.subscription_ids:
        return exc
    return ProtocolError("subscriptionIds", f"{sub_id}: {exc.problem}", exc.status)
