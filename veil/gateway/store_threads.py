"""Store access from the event loop: blocking store calls run on two dedicated threads, one for
writes (so that writes never contend with each other and group commits stay large) and one for
reads (so that a slow commit never delays pushing deliveries); a third waits for the store's signal
of new deliveries, where it has one; a fourth looks up the registry's newest version, which every
request waits for, so that the look never queues behind a large read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, TypeVarTuple, Unpack

from veil.store import GatewayStore, StoreUnavailable

T = TypeVar("T")
Args = TypeVarTuple("Args")  # a store call's arguments, checked against its signature


class StoreThreads:
    def __init__(self, store: GatewayStore) -> None:
        self.store = store
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="store-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="store-read")
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix="store-wait")
        self._head = ThreadPoolExecutor(1, thread_name_prefix="store-head")
        self.failure: tuple[float, str] | None = None  # (monotonic time, error) of the last failed write
        self.writes_queued = 0  # writes handed to the writing thread and not yet answered

    async def write(self, call: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        """Run a write; a StoreUnavailable is remembered for /health as well as raised."""
        self.writes_queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._writer, call, *args)
        except StoreUnavailable as exc:
            self.failed(exc)
            raise
        finally:
            self.writes_queued -= 1

    def failed(self, exc: StoreUnavailable) -> None:
        """A write failed on the store: /health says so for a while."""
        self.failure = (time.monotonic(), str(exc))

    async def read(self, call: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reader, call, *args)

    async def head(self, call: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._head, call, *args)

    async def wait(self, call: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._waiter, call, *args)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._waiter.shutdown(wait=True)
        self._head.shutdown(wait=True)
        self.store.close()
