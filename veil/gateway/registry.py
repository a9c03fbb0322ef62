"""The registry version the gateway authenticates and answers the admin API with: the newest one
(the pipeline applies each version in log order)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Callable
from pathlib import Path

from veil.gateway.store_threads import StoreThreads
from veil.security.registry import Registry, load_registry_file, parse_registry, registry_from_json


class CurrentRegistry:
    def __init__(self, threads: StoreThreads) -> None:
        self._threads = threads
        self.current = Registry()
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
        stored = await self._threads.read(store.registry_at, None)
        if stored is not None:
            self.current = registry_from_json(stored)

    async def replace(self, registry: Registry, file_digest: int | None = None) -> None:
        async with self._changing:
            await self._threads.write(self._threads.store.put_registry, registry.to_json(), file_digest)
            self.current = registry

    async def amend(self, change: Callable[[Registry, dict], None]) -> Registry:
        """A new version from the current one's document as `change` edits it (in place, on a copy,
        after checking it against the current version), one change at a time, so that two changes
        made at once both land."""
        async with self._changing:
            document = copy.deepcopy(self.current.document)
            change(self.current, document)
            registry = parse_registry(document)
            await self._threads.write(self._threads.store.put_registry, registry.to_json(), None)
            self.current = registry
            return registry
