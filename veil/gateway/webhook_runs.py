"""The webhook subscriptions a gateway delivers (`webhooks`), as the rest of the gateway sees them:
a subscription made or replaced through this gateway ends the delivery of its older version."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Running:
    """A webhook subscription this gateway delivers: its version, and how to end its delivery."""

    sub_id: str
    version: int
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class Webhooks:
    """The webhook subscriptions this gateway delivers, by number."""

    running: dict[int, Running] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # look now: one was made or replaced

    def changed(self, sub_id: str, webhook: bool) -> None:
        """A subscription of this id was made or replaced through this gateway (`webhook`: with one): a
        delivery of an older version ends, and the next look, now, starts the new one's."""
        for run in self.running.values():
            if run.sub_id == sub_id:
                run.ended.set()
                webhook = True
        if webhook:
            self.wake.set()
