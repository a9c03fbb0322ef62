"""The registry version the gateway authenticates and answers the admin API with: the newest one
(the pipeline applies each version in log order), also when another gateway on the store made it.

Versions are the log offsets the store gave them. Every change is compare-and-set on the version it
was made from, in the store's write transaction, so that a change another gateway stored meanwhile
is never overwritten: a change the gateway makes itself from the newest version (a publisher's
rules, a scope's keys) is made again from the newer one; a change its client based on a version
(`X-Registry-Version`) is refused with 409 naming the newest. Before a request is authenticated, the
gateway looks up the store's newest version (one index lookup, shared by the requests that arrive
while it runs), so that a revocation stored through any gateway holds on every one from the moment
it was acknowledged. Parsing and serializing registries run off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from veil.gateway.store_threads import StoreThreads
from veil.protocol import ProtocolError
from veil.security.registry import Registry, load_registry_file, parse_registry, registry_from_json
from veil.store import StaleRegistry, StoreUnavailable

FOLLOW_INTERVAL = 2.0  # seconds between looks for a version another gateway stored, between requests
AMEND_ATTEMPTS = 8  # times a change is made again from a newer version before the client is told to retry
VERSION_HEADER = "X-Registry-Version"  # the version an answer shows, and the one a change is based on
T = TypeVar("T")


def stale(current: int, base: int) -> ProtocolError:
    return ProtocolError(
        VERSION_HEADER, f"the registry is at version {current}, not {base}: read it again and redo the change", 409
    )


def base_version(request: web.Request, required: bool = False) -> int | None:
    """The registry version the request's change is based on, if it names one."""
    text = request.headers.get(VERSION_HEADER)
    if text is None:
        if required:
            raise ProtocolError(
                VERSION_HEADER, "name the registry version this change is based on (GET gives it in this header)", 428
            )
        return None
    if not (text.isascii() and text.isdigit() and len(text) < 19):
        raise ProtocolError(VERSION_HEADER, "a registry version: the whole number a GET answered with")
    return int(text)


class CurrentRegistry:
    def __init__(self, threads: StoreThreads, parsing: ThreadPoolExecutor, max_bytes: int) -> None:
        self._threads = threads
        self._parsing = parsing
        self.max_bytes = max_bytes  # the largest registry a change through the API may make
        self.current = Registry()
        self.version = 0  # the store's version of `current` (0: none stored)
        self.body = b"{}"  # `current` as stored, for answers
        self._changing = asyncio.Lock()
        self._look: asyncio.Task[None] | None = None  # the look at the store's version under way
        self._next: asyncio.Task[None] | None = None  # the one after it, for requests that came meanwhile

    async def load(self, file: str | Path | None) -> None:
        """A registry file applies when it is new or changed since it was last applied; otherwise the
        stored registry does, with the changes made through the admin API since."""
        store = self._threads.store
        if file is not None:
            registry = await self._off_loop(load_registry_file, file)
            body = await self._off_loop(registry.to_json)
            digest = int.from_bytes(hashlib.sha256(body).digest()[:7], "big")
            if await self._threads.read(store.registry_file_digest) != digest:
                async with self._changing:
                    await self._store(registry, body, file_digest=digest)
                return
        await self._adopt_stored()

    async def follow(self) -> None:
        """Adopt the versions other gateways store while no request asks (scope keys, admin changes)."""
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            with contextlib.suppress(StoreUnavailable):  # looked at again next time
                await self.fresh()

    async def fresh(self) -> Registry:
        """The newest registry as of a look at the store that began after this call: a request
        authenticated with it sees every change acknowledged before it arrived, whichever gateway
        made it. Requests arriving while a look runs share the next one."""
        if self._look is None:
            self._look = asyncio.ensure_future(self._looking(None))
            look = self._look
        else:
            if self._next is None:
                self._next = asyncio.ensure_future(self._looking(self._look))
            look = self._next
        await asyncio.shield(look)
        return self.current

    async def _looking(self, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait({after})
            self._look, self._next = self._next, None
        try:
            await self._adopt_stored()
        finally:
            if self._look is asyncio.current_task() and self._next is None:
                self._look = None

    async def _adopt_stored(self) -> None:
        """The store's newest version, if it is newer: looked up first, read whole only then."""
        store = self._threads.store
        if await self._threads.head(store.registry_version) <= self.version:
            return
        version, body = await self._threads.read(store.newest_registry)
        if version > self.version:
            registry = await self._off_loop(registry_from_json, body)
            if version > self.version:  # no newer one adopted meanwhile
                self.current, self.version, self.body = registry, version, body or b"{}"

    async def amend(self, change: Callable[[Registry, dict], None], base: int | None = None) -> tuple[Registry, int]:
        """A new version from the newest stored one's document as `change` edits it (in place, on a
        copy, after checking it against that version). With `base`, only if that is still the newest
        version (409 otherwise); without, the change is made again from a version another gateway
        stored meanwhile."""
        async with self._changing:
            for _ in range(AMEND_ATTEMPTS):
                await self._adopt_stored()
                current, version, stored = self.current, self.version, self.body  # together: a look may adopt more
                if base is not None and base != version:
                    raise stale(version, base)
                registry, body = await self._off_loop(_edited, current, stored, change)
                self._check_size(len(body))
                try:
                    return registry, await self._store(registry, body, base=version)
                except StaleRegistry:
                    if base is not None:
                        raise
        raise ProtocolError(VERSION_HEADER, "the registry changed on every attempt: retry the change", 409)

    def _check_size(self, size: int) -> None:
        """A change through the API may not grow the registry past the bound (one that shrinks it may):
        every version is a whole copy, which every gateway and the pipeline parse."""
        if size > self.max_bytes and size > len(self.body):
            raise ProtocolError(
                "registry", f"the change makes the registry {size} bytes, over the limit of {self.max_bytes} "
                "(--max-registry)", 413,
            )  # fmt: skip

    async def _store(
        self, registry: Registry, body: bytes, *, base: int | None = None, file_digest: int | None = None
    ) -> int:
        version = await self._threads.write(self._threads.store.put_registry, body, file_digest, base)
        if version > self.version:
            self.current, self.version, self.body = registry, version, body
        return version

    async def _off_loop(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._parsing, work, *args)


def _edited(current: Registry, stored: bytes, change: Callable[[Registry, dict], None]) -> tuple[Registry, bytes]:
    document = json.loads(stored)  # a copy of `current.document`, ten times faster than copying it
    change(current, document)
    registry = parse_registry(document)
    return registry, registry.to_json()
