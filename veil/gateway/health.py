"""What /health and /ready report: the pipeline's state as the gateway sees it, the log's progress,
the quarantine, and failed store writes (shown for a while after the last one)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from veil.gateway.delivery import DeliveryHub
from veil.gateway.ingest import Ingest
from veil.gateway.store_threads import StoreThreads

STORE_FAILURE_SHOWN = 10.0  # seconds a failed store write keeps /health degraded


class Health:
    def __init__(self, threads: StoreThreads, ingest: Ingest, hub: DeliveryHub) -> None:
        self._threads = threads
        self._ingest = ingest
        self._hub = hub
        self.pipeline_state = "starting"  # starting | running | restarting | stuck
        self.problems: list[str] = []  # why the pipeline side is degraded, as the progress loop last saw it
        self.quarantined = 0
        self.dark: list[int] = []  # matcher partitions without a running task, as the pipeline's driver saw it
        self.connections = 0  # open delivery connections (TCP and WebSocket)

    @contextlib.contextmanager
    def connection(self) -> Iterator[None]:
        """Count a delivery connection while it is open."""
        self.connections += 1
        try:
            yield
        finally:
            self.connections -= 1

    def report(self) -> dict[str, object]:
        failing = self._store_failing()
        problems = self.problems if failing is None else [*self.problems, failing]
        return {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "pipeline": self.pipeline_state,
            "head": self._ingest.head,
            "processed": self._ingest.processed,
            "lag": self._ingest.lag,
            "quarantined": self.quarantined,
            "darkPartitions": self.dark,
            "connections": self.connections,
            "subscriptionsConnected": len(self._hub.holders),
        }

    @property
    def ready(self) -> bool:
        """Serving its promise: a pipeline alive and making progress, and a store that takes writes."""
        return self.pipeline_state == "running" and not self._store_failing()

    def _store_failing(self) -> str | None:
        failure = self._threads.failure
        if failure is None or time.monotonic() - failure[0] > STORE_FAILURE_SHOWN:
            return None
        return f"store writes failing ({time.monotonic() - failure[0]:.0f} s ago): {failure[1]}"
