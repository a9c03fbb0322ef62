"""Group commit of publications with bounded memory.

Concurrent publish requests wait together for one store commit (one fsync), so throughput grows with
concurrency instead of being capped by disk latency. The writing thread takes the next group itself
as soon as a commit is done, until another write of the gateway waits for the thread: the next
group's start does not wait for a turn of the event loop, which can take milliseconds when it is
busy delivering. When too many publications wait for a commit,
the pipeline lags too far behind the log, or delivery to most connected clients lags behind the
pipeline, new publishes are refused with Overloaded (→ 503 and Retry-After) instead of piling
up in RAM or on disk.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from veil.gateway.delivery import Clients
from veil.gateway.store_threads import StoreThreads
from veil.monitoring import trace
from veil.store import KEYS_KEPT, Publication, StoreUnavailable

MIN_CLIENTS = 8  # fewer connected clients never count as delivery overload
# publications, their future, received ns, the registry version they were admitted with
Waiting = tuple[list[Publication], asyncio.Future[list[int]], int, int | None]


class Overloaded(Exception):
    def __init__(self, reason: str, retry_after: int = 1) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class Ingest:
    def __init__(
        self,
        threads: StoreThreads,
        max_pending: int,
        max_lag: int,
        clients_behind: Callable[[], Clients] = lambda: Clients(0, 0, 0),
        keys_kept: int = KEYS_KEPT,
    ) -> None:
        self._threads = threads
        self._keys_kept = keys_kept  # ms a publisher's idempotency key is remembered
        self._max_pending = max_pending
        self._max_lag = max_lag
        self._waiting: list[Waiting] = []  # taken by the writing thread, under _lock
        self._lock = threading.Lock()
        self._committing = False  # a run of commits is under way, or queued, on the writing thread
        self._pending = 0
        self._flusher: asyncio.Task[None] | None = None
        self.head = 0
        self.processed = 0
        # (clients reading their backlogs, clients connected) as the hub judges them when a publish asks
        # (DeliveryHub.judged_clients_behind): a view kept by a loop that also waits for the store could be
        # seconds old
        self.clients_behind = clients_behind

    @property
    def lag(self) -> int:
        return max(0, self.head - self.processed)

    async def append(self, bodies: list[Publication], registry: int | None = None) -> list[int]:
        """Log `bodies` with the next group commit; StaleRegistry (nothing logged) if they were admitted
        with registry version `registry` and a newer one is stored."""
        if self._pending + len(bodies) > self._max_pending:
            raise Overloaded(f"{self._pending} publications are waiting for the log")
        if self.lag > self._max_lag:
            raise Overloaded(f"the matching pipeline is {self.lag} log entries behind", retry_after=2)
        behind, connected, _ = self.clients_behind()
        # A slow client only grows its own backlog in the store, however many subscriptions it has, and
        # clients that read nothing are not counted (DeliveryHub.clients_behind); most of the clients
        # that read being behind means delivery as a whole cannot keep up (or the gateway's memory for
        # queued lines is used up), and taking more would only move matches from memory to disk.
        if connected >= MIN_CLIENTS and 2 * behind > connected:
            raise Overloaded(f"delivery is behind for {behind} of {connected} connected clients")
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending += len(bodies)
        with self._lock:
            self._waiting.append((bodies, future, time.time_ns(), registry))
            start, self._committing = not self._committing, True
        if start:
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not await self._threads.write(self._commit_run, loop):
                pass  # (queued again behind the writes that came meanwhile)
        except BaseException as exc:  # the writing thread is gone (the gateway stopping)
            with self._lock:
                group, self._waiting, self._committing = self._waiting, [], False
            self._failed(group, exc if isinstance(exc, Exception) else StoreUnavailable("the gateway is stopping"))
            raise

    def _commit_run(self, loop: asyncio.AbstractEventLoop) -> bool:
        """On the writing thread: commit what waits, group after group, each answered as it commits;
        True once nothing is left (the run has ended), False as soon as another write waits for the
        thread (a claim, a cursor save or a renewal waits behind at most one commit, as before)."""
        first = True
        while True:
            with self._lock:
                if not self._waiting:
                    self._committing = False
                    return True
                if not first and self._threads.writes_queued > 1:  # (this run is one of them)
                    return False
                group, self._waiting = self._waiting, []
            first = False
            everything = [body for bodies, _, _, _ in group for body in bodies]
            versions = [version for _, _, _, version in group if version is not None]
            try:
                offsets = self._threads.store.append_publications(
                    everything, min(versions) if versions else None, self._keys_kept
                )
            except Exception as exc:  # the store failed, or the registry changed: none is acknowledged
                loop.call_soon_threadsafe(self._failed, group, exc)
            else:
                loop.call_soon_threadsafe(self._committed, group, offsets)

    def _committed(self, group: list[Waiting], offsets: list[int]) -> None:
        self.head = max(self.head, *offsets)  # (a repeat is answered with an older offset)
        position = 0
        for bodies, future, _, _ in group:
            self._pending -= len(bodies)
            if not future.done():
                future.set_result(offsets[position : position + len(bodies)])
            position += len(bodies)
        if trace.DIRECTORY:  # (last: a trace that cannot be written holds up no answer)
            _trace_commit(group, offsets)

    def _failed(self, group: list[Waiting], exc: Exception) -> None:
        if isinstance(exc, StoreUnavailable):
            self._threads.failed(exc)  # (run on the writing thread, not through its `write`)
        for bodies, future, _, _ in group:
            self._pending -= len(bodies)
            if not future.done():
                future.set_exception(exc)

    async def drain(self) -> None:
        """Wait for every accepted publication to be committed (graceful shutdown)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)


def _trace_commit(group: list[Waiting], offsets: list[int]) -> None:
    position = 0
    for bodies, _, received, _ in group:
        taken = offsets[position : position + len(bodies)]  # (a repeat's is its first publication's)
        trace.mark("received", min(taken) - 1, max(taken), received)
        position += len(bodies)
    trace.mark("committed", min(offsets) - 1, max(offsets))
