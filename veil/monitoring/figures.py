"""What the monitoring views (the SELIS channel, /metrics) read from the store: the totals, with the
deliveries this gateway sent and has not yet counted there, and the micro-batch durations."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from veil.store import BatchDurations, Totals

if TYPE_CHECKING:
    from veil.gateway.context import Gateway


class StoreFigures(NamedTuple):
    totals: Totals
    batches: BatchDurations


async def totals(gateway: Gateway) -> Totals:
    stored = await gateway.threads.read(gateway.threads.store.totals)
    return stored._replace(forwarded=stored.forwarded + gateway.hub.forwarded)


async def store_figures(gateway: Gateway) -> StoreFigures:
    batches = await gateway.threads.read(gateway.threads.store.batch_durations)
    return StoreFigures(await totals(gateway), batches)
