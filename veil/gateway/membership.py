"""This gateway among the others sharing its store. It renews its row every RENEW seconds with how
far it has fanned out the feed, and claims each subscription it delivers to, so that a subscriber
connected through two gateways at once is refused on the second. A gateway silent for STALE seconds
counts as gone: its claims lapse (its subscribers may reconnect elsewhere) and compaction stops
keeping feed rows for it. A live gateway's claims never lapse: a release that fails is retried with
the renewals, and a gateway starting under the name of one that stopped without leaving (a crash)
drops that one's claims first, once that one has been silent for STALE seconds; one starting under the
name of a gateway still renewing is refused (each would drop the other's claims)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from veil.gateway.context import Gateway
from veil.protocol import ProtocolError

log = logging.getLogger("veil.gateway")
RENEW = 2.0  # seconds between renewals
STALE = 10.0  # seconds without one after which a gateway counts as gone
RELEASES_PER_RENEWAL = 64  # failed releases made again after each renewal
WATCH = 0.5  # seconds between looks at a namesake's row


async def start(gateway: Gateway) -> None:
    await _outlive_namesake(gateway)
    await leave(gateway)
    await join(gateway)


async def _outlive_namesake(gateway: Gateway) -> None:
    """Wait until a gateway of this name that renewed its row less than STALE seconds ago counts as
    gone; ValueError if it renews again meanwhile (it is running)."""
    threads, name = gateway.threads, gateway.config.gateway_name
    seen = await threads.read(threads.store.gateway_seen, name)
    while seen is not None and time.time() - seen < STALE:
        await asyncio.sleep(WATCH)
        again = await threads.read(threads.store.gateway_seen, name)
        if again is not None and again != seen:
            raise ValueError(
                f"--gateway-id {name}: a gateway of that name is running on this store (it renewed its row "
                f"{time.time() - again:.1f} s ago); give each gateway its own id"
            )
        seen = again


async def join(gateway: Gateway) -> None:
    threads = gateway.threads
    await threads.write(threads.store.renew_gateway, gateway.config.gateway_name, gateway.hub.last_seq)


async def stay_alive(gateway: Gateway) -> None:
    while True:
        await asyncio.sleep(RENEW)
        try:
            await join(gateway)
            await _release_again(gateway)
        except Exception:
            log.exception("renewing this gateway's row in the store, or releasing claims again, failed")


async def _release_again(gateway: Gateway) -> None:
    """A few of the releases that failed, so that the next renewal is never late however many wait."""
    threads, unreleased = gateway.threads, gateway.unreleased
    for _ in range(min(len(unreleased), RELEASES_PER_RENEWAL)):
        sub_ids, at = unreleased[0]
        await threads.write(threads.store.release_subscriptions, sub_ids, gateway.config.gateway_name, at)
        unreleased.pop(0)


async def leave(gateway: Gateway) -> None:
    threads = gateway.threads
    await threads.write(threads.store.leave, gateway.config.gateway_name)


async def fanned_out(gateway: Gateway) -> int:
    """The feed seq that this and every other live gateway have fanned out."""
    threads = gateway.threads
    others = await threads.read(threads.store.fanned_out, time.time() - STALE)
    return min(others, gateway.hub.last_seq)


class Held(Exception):
    """A subscription a connection names is connected through another gateway (`holder`), or is its
    client's no more (None): removed since it was admitted."""

    def __init__(self, sub_id: str, holder: str | None) -> None:
        super().__init__(sub_id, holder)
        self.sub_id = sub_id
        self.error = None  # the caller answers as for an id nobody holds
        if holder is not None:
            problem = f"connected through gateway {holder}; retry once that connection has ended"
            self.error = ProtocolError("subscriptionId", problem, 503)


async def claim(gateway: Gateway, sub_ids: Sequence[str], numbers: Sequence[int]) -> float:
    """Take the deliveries of these subscriptions (each id's of that number) for this gateway, all or
    none (Held: none); returns the claim's time, which releases them."""
    threads, at = gateway.threads, time.time()
    store, name = threads.store, gateway.config.gateway_name
    held = await threads.write(store.claim_subscriptions, sub_ids, numbers, name, at, at - STALE)
    if held is not None:
        raise Held(*held)
    return at


async def release(gateway: Gateway, sub_ids: Sequence[str], at: float) -> None:
    """The claim taken at `at` ends; if the store cannot take it now, it is retried with the renewals."""
    threads = gateway.threads
    try:
        await threads.write(threads.store.release_subscriptions, sub_ids, gateway.config.gateway_name, at)
    except Exception:
        log.warning("releasing %d subscriptions' claim failed; retried with the renewals", len(sub_ids))
        gateway.unreleased.append((list(sub_ids), at))
