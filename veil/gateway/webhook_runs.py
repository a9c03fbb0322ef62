"""The webhook subscriptions a gateway delivers (`webhooks`), as the rest of the gateway sees them:
a subscription made or replaced through this gateway ends the delivery of its older version."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

RESOLVE_SECONDS = 5.0  # a name's resolution at most (c-ares: no thread is held meanwhile)


@dataclass
class Running:
    """A webhook subscription this gateway delivers: its version, and how to end its delivery."""

    number: int
    version: int
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class Webhooks:
    """The webhook subscriptions this gateway delivers, by id (every /subscribe looks its id up)."""

    running: dict[str, Running] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # look now: one was made or replaced
    after: int = 0  # the number the next look for unclaimed ones starts after (they are taken a page a look)
    _names: aiohttp.AsyncResolver | None = None

    def names(self) -> aiohttp.AsyncResolver:
        """The resolver for endpoints' names (made in the event loop, once)."""
        if self._names is None:
            self._names = aiohttp.AsyncResolver(timeout=RESOLVE_SECONDS, tries=1)
        return self._names

    async def close_names(self) -> None:
        if self._names is not None:
            await self._names.close()
            self._names = None

    def changed(self, sub_id: str, webhook: bool) -> None:
        """A subscription of this id was made or replaced through this gateway (`webhook`: with one): a
        delivery of an older version ends, and the next look, now, starts the new one's."""
        run = self.running.get(sub_id)
        if run is not None:
            run.ended.set()
        if webhook or run is not None:
            self.wake.set()
