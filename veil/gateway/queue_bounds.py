"""The bounds on subscriptions' queues, from the gateway: the operator's (`--max-queued-*`), what a
subscriber asks within them, and the periodic pass that dead-letters what queues hold past them.

One part of the pass takes the queues no live gateway holds (after their cursors); this gateway takes
its own connections' subscriptions that read their backlog from the store, after what each has
read, which only it knows (`veil.store.relational.dead_letters` says why a delivery is then either
dead-lettered or delivered, never both). Subscriptions taking live offers have nothing queued past
what they were offered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable

from veil.config import Config
from veil.gateway import membership
from veil.gateway.context import Gateway
from veil.protocol import ProtocolError
from veil.protocol.subscriptions import QueueLimits
from veil.store import QueueBounds
from veil.store.queues import COMPACT_CHUNK
from veil.store.relational.log import CLOCKS_DIFFER

log = logging.getLogger("veil.gateway")

BOUND_INTERVAL = 5.0  # seconds between passes over the queues' counts
AGES_EVERY = 6  # passes between checks of the queues' ages (a read of each queue): an age bound holds to 30 s
OPTIONS = {"deliveries": "--max-queued-deliveries", "bytes": "--max-queued-bytes", "age": "--max-queued-age"}
UNBOUNDED = 2**62  # what a subscriber leaves out: the operator's bound, whatever it is later


def operator_bounds(config: Config) -> QueueBounds:
    return QueueBounds(config.max_queued_deliveries, config.max_queued_bytes, round(config.max_queued_age * 1000))


def subscriber_bounds(limits: QueueLimits, config: Config) -> QueueBounds:
    """A subscriber's limits as the store keeps them; one past the operator's is refused by name."""
    most = operator_bounds(config)
    for name, asked, allowed in zip(QueueLimits._fields, limits, most, strict=True):
        if asked is not None and asked > allowed:
            unit = " ms" if name == "age" else ""
            raise ProtocolError(f"limits.{name}", f"at most {allowed}{unit} ({OPTIONS[name]})")
    return QueueBounds(*(UNBOUNDED if asked is None else asked for asked in limits))


async def bound_queues(gateway: Gateway) -> None:
    """Every BOUND_INTERVAL, a pass over the queues; every AGES_EVERY, over their ages too."""
    for passes in itertools.count():
        await asyncio.sleep(BOUND_INTERVAL)
        try:
            await bound_once(gateway, ages=passes % AGES_EVERY == 0)
        except Exception:
            log.exception("bounding the queues failed")


async def bound_once(gateway: Gateway, ages: bool = True) -> None:
    """Dead-letter what the queues hold past their bounds: those no live gateway holds, then this
    one's connections' backlogs, a chunk at a time, resting between chunks as long as each took
    (they share the store's writer with publishes). A gateway whose renewals stopped longer ago than
    clocks may differ has left: its claims are void."""
    threads, name = gateway.threads, gateway.config.gateway_name
    bounds = operator_bounds(gateway.config)
    alive_since = time.time() - membership.STALE - CLOCKS_DIFFER / 1000
    while await _chunk(threads.write(threads.store.bound_queues, bounds, _now(), alive_since, COMPACT_CHUNK, ages)):
        pass

    async def held(floors: dict[int, int]) -> None:
        while await _chunk(threads.write(threads.store.bound_held_queues, floors, name, bounds, _now(), COMPACT_CHUNK)):
            pass

    await gateway.hub.bound_backlogs(held)


async def _chunk(step: Awaitable[int]) -> bool:
    """One step; whether another is due (after a rest as long as it took)."""
    began = time.monotonic()
    if await step < COMPACT_CHUNK:
        return False
    await asyncio.sleep(time.monotonic() - began)
    return True


def _now() -> int:
    return time.time_ns() // 1_000_000
