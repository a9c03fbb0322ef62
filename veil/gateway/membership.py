"""This gateway among the others sharing its store. It renews its row every RENEW seconds with how
far it has fanned out the feed, and claims each subscription it delivers to, so that a subscriber
connected through two gateways at once is refused on the second. A gateway silent for STALE seconds
counts as gone: its claims lapse (its subscribers may reconnect elsewhere) and compaction stops
keeping feed rows for it. A live gateway's claims never lapse: a release that fails is retried with
the renewals.

A gateway's name (--gateway-id) is held by one process at a time, its incarnation: one starting under
the name of a gateway still renewing is refused, one starting under the name of a gateway that
stopped without leaving (a crash) drops that one's claims and takes the name over, and a process
that finds its name taken over (it was silent too long, or two started at once) stops: two
processes renewing one name would each drop the other's claims."""

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
WATCH_FOR = STALE  # seconds a namesake's row must stay as it is for the namesake to count as gone


async def start(gateway: Gateway) -> None:
    await _outlive_namesake(gateway)
    threads = gateway.threads
    name, incarnation = gateway.config.gateway_name, gateway.incarnation
    await threads.write(threads.store.take_over_gateway, name, incarnation, gateway.hub.last_seq)
    gateway.claims.renewed = time.monotonic()


async def _outlive_namesake(gateway: Gateway) -> None:
    """A gateway of this name that has a row may be running (it left otherwise): its row is watched for
    WATCH_FOR seconds of this machine's own clock (the clocks' skew has no say). Renewed meanwhile, it
    is running (ValueError); not, it stopped without leaving."""
    threads, name = gateway.threads, gateway.config.gateway_name
    row = await threads.read(threads.store.gateway_row, name)
    if row is None:
        return
    log.info("a gateway named %s has a row in the store: watching it for %g s", name, WATCH_FOR)
    deadline = time.monotonic() + WATCH_FOR
    while time.monotonic() < deadline:
        await asyncio.sleep(WATCH)
        again = await threads.read(threads.store.gateway_row, name)
        if again is not None and again != row:
            raise ValueError(
                f"--gateway-id {name}: a gateway of that name is running on this store (it renewed its row "
                f"{time.time() - again[0]:.1f} s ago); give each gateway its own id"
            )
        row = again
        if row is None:  # it left
            return


async def renew(gateway: Gateway) -> bool:
    """False when another process has taken this gateway's name over."""
    threads = gateway.threads
    name, incarnation = gateway.config.gateway_name, gateway.incarnation
    return await threads.write(threads.store.renew_gateway, name, incarnation, gateway.hub.last_seq)


async def stay_alive(gateway: Gateway) -> None:
    while True:
        await asyncio.sleep(RENEW)
        try:
            renewed = await renew(gateway)
            if renewed:
                gateway.claims.renewed = time.monotonic()
            if not renewed:
                log.error(
                    "another gateway took the id %s over (this one was silent %g s, or both started at once): "
                    "stopping", gateway.config.gateway_name, STALE,
                )  # fmt: skip
                gateway.replaced.set()
                gateway.stop.set()
                return
            await _release_again(gateway)
        except Exception:
            log.exception("renewing this gateway's row in the store, or releasing claims again, failed")


async def _release_again(gateway: Gateway) -> None:
    """A few of the releases that failed (or waited for their cursors to be saved: they are saved
    first), so that the next renewal is never late however many wait."""
    threads, unreleased = gateway.threads, gateway.unreleased
    unreleased += gateway.claims.unreleased  # (made for connections that went before they had them)
    gateway.claims.unreleased.clear()
    if unreleased and not await gateway.hub.flush_cursors(bundles=False):
        return
    for _ in range(min(len(unreleased), RELEASES_PER_RENEWAL)):
        sub_ids, at = unreleased[0]
        await threads.write(threads.store.release_subscriptions, sub_ids, gateway.config.gateway_name, at)
        unreleased.pop(0)


async def leave(gateway: Gateway) -> None:
    threads = gateway.threads
    await threads.write(threads.store.leave, gateway.config.gateway_name, gateway.incarnation)


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
    at, held = await gateway.claims.claim(gateway.threads, sub_ids, numbers, gateway.config.gateway_name, STALE)
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
