"""The bounds on subscriptions' queues, from the gateway: the operator's (`--max-queued-*`), what a
subscriber asks within them, and the periodic pass that dead-letters what queues hold past them.

Compaction's pass takes the queues no live gateway holds (after their cursors); this gateway takes
its own connections' subscriptions that read their backlog from the store, after what each has
read, which only it knows (`veil.store.relational.dead_letters` says why a delivery is then either
dead-lettered or delivered, never both). Subscriptions taking live offers have nothing queued past
what they were offered.
"""

from __future__ import annotations

import asyncio
import logging
import time

from veil.config import Config
from veil.gateway import membership
from veil.gateway.context import Gateway
from veil.protocol import ProtocolError
from veil.protocol.subscriptions import QueueLimits
from veil.store import QueueBounds
from veil.store.queues import COMPACT_CHUNK

log = logging.getLogger("veil.gateway")

BOUND_INTERVAL = 5.0  # seconds between passes: an age bound holds to about this much
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
    """Every BOUND_INTERVAL, dead-letter what the queues hold past their bounds, a chunk at a time."""
    threads, name = gateway.threads, gateway.config.gateway_name

    async def held(floors: dict[int, int]) -> None:
        while await threads.write(threads.store.bound_held_queues, floors, name, bounds, _now(), COMPACT_CHUNK) >= (
            COMPACT_CHUNK
        ):
            pass

    while True:
        await asyncio.sleep(BOUND_INTERVAL)
        bounds = operator_bounds(gateway.config)
        try:
            alive_since = time.time() - membership.STALE
            while await threads.write(threads.store.bound_queues, bounds, _now(), alive_since, COMPACT_CHUNK) >= (
                COMPACT_CHUNK
            ):
                pass
            await gateway.hub.bound_backlogs(held)
        except Exception:
            log.exception("bounding the queues failed")


def _now() -> int:
    return time.time_ns() // 1_000_000
