"""Claims of subscriptions for this gateway, made together: the claims connections ask for while one
is under way go to the store as one write. Each claim is a write transaction on the gateway's one
writing thread, where publications' group commits wait their turn: hundreds of subscribers
connecting at once (each a connection of one subscription) queued hundreds of claims, one after the
other, ahead of the publications' next group commit (512 connections of one subscription each were
admitted in 0.89 s on PostgreSQL and 0.52 s on SQLite, one write each; 0.50 and 0.20 s gathered).

A claim is all or none for the connection that asked for it, never for the others it was gathered
with: when the write of several finds one of them held (or removed), none of them was taken; the
connections naming that subscription are refused, and the others claimed again together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from veil.gateway.store_threads import StoreThreads

Holder = tuple[str, str | None]  # (a subscription id, the gateway holding it, or None: removed)


@dataclass
class Asked:
    sub_ids: list[str]
    numbers: list[int]
    done: asyncio.Future[tuple[float, Holder | None]]  # (the claim's time, what held it, if anything)


class Claims:
    def __init__(self) -> None:
        self._asked: list[Asked] = []
        self._claiming: asyncio.Future[None] | None = None
        # claims made for connections that went meanwhile, released with the gateway's renewals
        self.unreleased: list[tuple[list[str], float]] = []
        # when this gateway last renewed its row (monotonic seconds): its claims hold while it renews,
        # and what acts on them without the store at hand (webhook requests) waits while it cannot
        self.renewed = time.monotonic()

    async def claim(
        self, threads: StoreThreads, sub_ids: Sequence[str], numbers: Sequence[int], gateway: str, stale: float
    ) -> tuple[float, Holder | None]:
        """`GatewayStore.claim_subscriptions` of these, gathered with others asked for meanwhile;
        returns the claim's time (which releases it) and, if none was taken, what held one."""
        done: asyncio.Future[tuple[float, Holder | None]] = asyncio.get_running_loop().create_future()
        self._asked.append(Asked(list(sub_ids), list(numbers), done))
        if self._claiming is None or self._claiming.done():
            self._claiming = asyncio.ensure_future(self._claim_asked(threads, gateway, stale))
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:  # its connection went: a claim made for it is released later
            if not done.done():
                done.cancel()  # (seen when the claim is made)
            elif not done.cancelled() and done.exception() is None and done.result()[1] is None:
                self.unreleased.append((list(sub_ids), done.result()[0]))
            raise

    async def _claim_asked(self, threads: StoreThreads, gateway: str, stale: float) -> None:
        while self._asked:
            gathered: list[Asked] = []
            later: list[Asked] = []
            ids: set[str] = set()
            for asked in self._asked:
                if asked.done.done():  # (its connection went before anything was claimed for it)
                    continue
                # an id asked for twice (a subscriber reconnecting while its old connection lingers)
                # is claimed again after: each claim has its own time, which only its own release ends
                if gathered and not ids.isdisjoint(asked.sub_ids):
                    later.append(asked)
                    continue
                gathered.append(asked)
                ids.update(asked.sub_ids)
            self._asked = later
            try:
                await self._claim_together(threads, gathered, gateway, stale)
            except Exception as error:  # each connection fails as its own claim would have
                for asked in gathered:
                    if not asked.done.done():
                        asked.done.set_exception(error)

    async def _claim_together(self, threads: StoreThreads, gathered: list[Asked], gateway: str, stale: float) -> None:
        store, pending = threads.store, gathered
        while pending := [asked for asked in pending if not asked.done.done()]:
            at = time.time()
            sub_ids = [sub_id for asked in pending for sub_id in asked.sub_ids]
            numbers = [number for asked in pending for number in asked.numbers]
            held = await threads.write(store.claim_subscriptions, sub_ids, numbers, gateway, at, at - stale)
            # held: none was taken, and the store names the least id removed, else the least held, of all of
            # them, which is what each connection naming it would have been told on its own; those
            # are refused, and the others claimed again together (a write more for each such id)
            named = [asked for asked in pending if held is None or held[0] in asked.sub_ids] or pending
            for asked in named:
                self._answer(asked, at, held)  # (answered: no longer pending)

    def _answer(self, asked: Asked, at: float, held: Holder | None) -> None:
        """Hand the claim to its connection; one that went meanwhile has it released, as it would have."""
        if not asked.done.done():
            asked.done.set_result((at, held))
        elif held is None:
            self.unreleased.append((asked.sub_ids, at))
