"""An edge broker (SPEC §9, S4 §3): it stands in for local publishers (sensors on a phone or a
gateway), announces what they can produce, and learns from the cloud which active subscriptions
could want it. It matches readings locally with the cloud's own matching code and publishes only
those some subscription wants; `wanted` (and the `on_wanted` callback) tells the local publishers
whether anyone wants anything at all, so that a sensor can be switched off when nobody does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from veil.client.client import VeilClient
from veil.client.errors import FATAL, VeilError, error_from_document
from veil.matching import SubscriptionIndex
from veil.protocol import flatten

Wanted = Callable[[bool], Awaitable[None] | None]


class EdgeBroker:
    def __init__(
        self,
        client: VeilClient,
        announcement: list[dict],
        *,
        announcement_id: str | None = None,
        on_wanted: Wanted | None = None,
    ) -> None:
        self.client = client
        self.announcement = announcement
        self.announcement_id = announcement_id
        self.on_wanted = on_wanted
        self.index = SubscriptionIndex()
        self.synced = asyncio.Event()  # set once the cloud's current subscriptions are in
        self.published = self.withheld = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def wanted(self) -> bool:
        return len(self.index) > 0

    async def __aenter__(self) -> EdgeBroker:
        reply = await self.client.announce(self.announcement, self.announcement_id)
        self.announcement_id = reply["announcementId"]
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self, revoke: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if revoke and self.announcement_id is not None:
            with contextlib.suppress(VeilError, OSError):
                await self.client.revoke(self.announcement_id)

    async def publish(self, publication: dict[str, Any]) -> str | None:
        """Publish if some subscription could want it; None when it was withheld."""
        if not self.index.match(flatten(publication)):
            self.withheld += 1
            return None
        self.published += 1
        return await self.client.publish(publication)

    async def _follow(self) -> None:
        """Keep the channel open; after a reconnect the cloud sends the whole set again."""
        delay = 0.2
        while True:
            try:
                await self._channel()
            except FATAL:
                raise
            except VeilError:
                pass
            except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
                pass
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    async def _channel(self) -> None:
        client = self.client
        channel = await client.open_channel()
        try:
            handshake: dict[str, Any] = {"announcementId": self.announcement_id}
            if client.auth_hash is not None:
                handshake["authHash"] = client.auth_hash
            if client.token is not None:
                handshake["token"] = client.token
            await channel.send(orjson.dumps(handshake))
            was_wanted, self.index = self.wanted, SubscriptionIndex()
            async for line in channel.documents():
                doc = orjson.loads(line)
                if "subscribe" in doc:
                    self.index.add(doc["subscribe"], doc["data"])
                elif "unsubscribe" in doc:
                    self.index.remove(doc["unsubscribe"])
                elif "synced" in doc:
                    self.synced.set()
                elif "error" in doc:
                    raise error_from_document(doc)
                if self.synced.is_set() and self.wanted != was_wanted:
                    was_wanted = self.wanted
                    await self._tell(was_wanted)
            raise ConnectionResetError("broker closed the channel")
        finally:
            await channel.close()

    async def _tell(self, wanted: bool) -> None:
        if self.on_wanted is not None:
            result = self.on_wanted(wanted)
            if asyncio.iscoroutine(result):
                await result
