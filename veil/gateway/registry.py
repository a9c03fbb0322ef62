"""The registry version the gateway authenticates and answers the admin API with: the newest one
(the pipeline applies each version in log order), also when another gateway on the store made it."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Callable
from pathlib import Path

from veil.gateway.store_threads import StoreThreads
from veil.security.registry import Registry, load_registry_file, parse_registry, registry_from_json

FOLLOW_INTERVAL = 2.0  # seconds between looks for a version another gateway stored


class CurrentRegistry:
    def __init__(self, threads: StoreThreads) -> None:
        self._threads = threads
        self.current = Registry()
        self._body: bytes | None = None  # the current version as stored
        self._changing = asyncio.Lock()

    async def load(self, file: str | Path | None) -> None:
        """A registry file applies when it is new or changed since it was last applied; otherwise the
        stored registry does, with the changes made through the admin API since."""
        store = self._threads.store
        if file is not None:
            registry = load_registry_file(file)
            digest = int.from_bytes(hashlib.sha256(registry.to_json()).digest()[:7], "big")
            if await self._threads.read(store.registry_file_digest) != digest:
                await self.replace(registry, digest)
                return
        await self._adopt_stored()

    async def follow(self) -> None:
        """Adopt the versions other gateways store (scope keys, admin changes made through them)."""
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            async with self._changing:
                await self._adopt_stored()

    async def _adopt_stored(self) -> None:
        stored = await self._threads.read(self._threads.store.registry_at, None)
        if stored is not None and stored != self._body:
            self.current, self._body = registry_from_json(stored), stored

    async def replace(self, registry: Registry, file_digest: int | None = None) -> None:
        async with self._changing:
            await self._store(registry, file_digest)

    async def _store(self, registry: Registry, file_digest: int | None) -> None:
        body = registry.to_json()
        await self._threads.write(self._threads.store.put_registry, body, file_digest)
        self.current, self._body = registry, body

    async def amend(self, change: Callable[[Registry, dict], None]) -> Registry:
        """A new version from the newest stored one's document as `change` edits it (in place, on a
        copy, after checking it against that version), one change at a time, so that two changes
        made at once both land."""
        async with self._changing:
            await self._adopt_stored()
            document = copy.deepcopy(self.current.document)
            change(self.current, document)
            registry = parse_registry(document)
            await self._store(registry, None)
            return registry
