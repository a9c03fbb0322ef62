"""The micro-batch durations Spark measures, handed to the heartbeat that writes them to the store
(where /metrics reads them as a histogram): Spark calls the listener for every finished batch,
the heartbeat drains what was collected every half second, so timing a batch costs it nothing."""

from __future__ import annotations

import threading

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from veil.monitoring import trace


class BatchTimes(StreamingQueryListener):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()  # Spark calls the listener from threads of its own
        self._durations: list[int] = []
        self.finished = 0  # micro-batches finished since the query started

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        with self._lock:
            self._durations.append(int(event.progress.batchDuration))
            self.finished += 1
        if trace.DIRECTORY:  # Spark's own split of the batch, by phase (ms)
            for phase, ms in event.progress.durationMs.items():
                trace.mark(f"spark.{phase}", event.progress.batchId, ms)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    def drain(self) -> list[int]:
        """The durations (ms) collected since the last drain."""
        with self._lock:
            durations, self._durations = self._durations, []
        return durations

    def restore(self, durations: list[int]) -> None:
        """Keep durations whose write failed for the next one."""
        with self._lock:
            self._durations[:0] = durations
