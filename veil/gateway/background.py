"""The gateway's loops besides serving requests, started and stopped as one: fanning out the
pipeline's feed, saving cursors, following the pipeline's progress and health, compacting the
store, renewing this gateway's row among those sharing the store, adopting registry versions other
gateways stored, delivering webhook subscriptions, and supervising the pipeline process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine

from veil.gateway import membership, queue_bounds, webhooks
from veil.gateway.context import Gateway
from veil.gateway.pipeline_process import PipelineProcess
from veil.protocol import ProtocolError
from veil.store import KIND_SUBSCRIBE, PipelineStatus
from veil.store.queues import COMPACT_CHUNK, COMPACT_IDLE_INTERVAL, COMPACT_INTERVAL, SPILL_AFTER

log = logging.getLogger("veil.gateway")
PROGRESS_INTERVAL = 0.1  # seconds between reads of the pipeline's progress while it is behind
CAUGHT_UP_INTERVAL = 1.0  # and at most this long while it is caught up
HEARTBEAT_STALE = 10.0  # seconds without a pipeline heartbeat after which it counts as stuck


class Background:
    def __init__(self, gateway: Gateway, pipeline: PipelineProcess | None) -> None:
        self.gateway = gateway
        self.pipeline = pipeline
        self._quarantine_seq = 0  # the last quarantined entry whose subscriber was told
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        hub = self.gateway.hub
        loops: list[Coroutine[None, None, None]] = [
            hub.poll(), hub.save_cursors_periodically(), self._track_progress(), self._compact(),
            queue_bounds.bound_queues(self.gateway), membership.stay_alive(self.gateway),
            self.gateway.registry.follow(), self.gateway.credentials.follow(self.gateway.registry, self.gateway.auth),
            webhooks.supervise(self.gateway),
        ]  # fmt: skip
        if self.pipeline is not None:
            loops.append(self.pipeline.supervise())
        self._tasks = [asyncio.create_task(loop) for loop in loops]

    async def stop(self) -> None:
        """Stop the pipeline gracefully, then the loops."""
        if self.pipeline is not None:
            await self.pipeline.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _track_progress(self) -> None:
        """Keep the figures that back-pressure and /health use fresh (the pipeline writes them)."""
        gateway = self.gateway
        health = gateway.health
        while True:
            try:
                gateway.ingest.processed = await gateway.threads.read(gateway.threads.store.processed_offset)
                # the log's head counts what every gateway logged (publications and subscriptions alike),
                # so that /health and --max-lag see the pipeline's whole backlog, not this gateway's part
                head = await gateway.threads.read(gateway.threads.store.head_offset)
                gateway.ingest.head = max(gateway.ingest.head, head)
                status = await gateway.threads.read(gateway.threads.store.pipeline_status)
                problems = self._pipeline_problems(status)
                health.quarantined = status.quarantined
                if status.last_quarantined > self._quarantine_seq:
                    await self._tell_quarantined_owners()
                if health.quarantined:
                    problems.append(f"{health.quarantined} log entries quarantined (see GET /admin/quarantine)")
                health.problems = problems
            except Exception as exc:
                log.exception("reading pipeline progress failed")
                health.problems = [f"cannot read the store: {exc}"]
            await self._until_progress_matters()

    async def _until_progress_matters(self) -> None:
        """PROGRESS_INTERVAL while the pipeline is behind (back-pressure reads its lag); caught up, until
        this gateway accepts a publication or CAUGHT_UP_INTERVAL has passed (others' entries and
        /health's figures can wait that long), so that an idle gateway reads three rows a second, not
        thirty."""
        ingest = self.gateway.ingest
        seen = ingest.head
        until = time.monotonic() + CAUGHT_UP_INTERVAL
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL)
            if ingest.lag > 0 or ingest.head != seen or time.monotonic() >= until:
                return

    def _pipeline_problems(self, status: PipelineStatus) -> list[str]:
        """The pipeline's state from what can be seen of it: its process (when this gateway runs it),
        the process id it registered, and its heartbeat (written every second, with the last sign
        of life of the matcher partition heard from least recently)."""
        gateway, pipeline = self.gateway, self.pipeline
        health = gateway.health
        health.dark = []  # known only from a pipeline that beats
        if pipeline is not None and not pipeline.alive:
            health.pipeline_state = "restarting"
            exited = "" if pipeline.exited is None else f" (exit code {pipeline.exited})"
            last = f": {pipeline.last_error}" if pipeline.last_error else ""
            return [f"the pipeline process is not running{exited}; restarting{last}"]
        own = pipeline.process.pid if pipeline is not None and pipeline.process is not None else None
        if not status.pid or (own is not None and status.pid != own):
            health.pipeline_state = "starting"
            return ["the pipeline is starting"]
        now = time.time()
        if status.heartbeat is None or now - status.heartbeat > HEARTBEAT_STALE:
            silent = now - (status.heartbeat or status.registered)
            health.pipeline_state = "stuck"
            return [f"no heartbeat from the pipeline for {silent:.0f} s"]
        health.dark = list(status.dark)
        if status.quiet_since and now - status.quiet_since / 1000 > gateway.config.stall_timeout:
            health.pipeline_state = "stuck"
            return [f"a matcher partition has given no sign of life for {now - status.quiet_since / 1000:.0f} s"]
        health.pipeline_state = "running"
        if status.dark:  # until a running task adopts them: a few seconds, unless no task can
            return [f"matcher partitions without a running task: {', '.join(map(str, status.dark))}"]
        return []

    async def _tell_quarantined_owners(self) -> None:
        """Tell the connected owner of a subscription newly quarantined."""
        threads = self.gateway.threads
        for record in await threads.read(threads.store.quarantine, self._quarantine_seq):
            self._quarantine_seq = record.seq
            if record.kind == KIND_SUBSCRIBE and record.sub_id is not None:
                reason = ProtocolError("subscriptionId", f"quarantined by the broker: {record.error}", 422)
                self.gateway.hub.kick(record.sub_id, reason.to_json())

    async def _compact(self) -> None:
        """Keep the store's size proportional to what is still queued, not to everything ever sent.

        Between two steps compaction rests as long as the step took: it shares the store's writer
        (publishes wait for it) and SQLite's write lock (so does the pipeline's recording of its
        rounds), and while it rests the matches it would spill are being consumed — spilling is
        cheapest late, when most of a feed entry needs no queue row any more. Between rounds it
        rests COMPACT_INTERVAL; once a round found nothing to do and neither the log nor the feed
        moved, twice as long each time up to COMPACT_IDLE_INTERVAL (an idle broker's compaction was
        a quarter of what it asked of its store), until they move."""
        rest, moved = COMPACT_INTERVAL, True
        while True:
            handled = await self._compaction_round()
            idle = handled == 0 and not moved  # a round that failed is tried again as soon as ever
            rest = min(2 * rest, COMPACT_IDLE_INTERVAL) if idle else COMPACT_INTERVAL
            moved = await self._until_moved(rest)

    async def _compaction_round(self) -> int | None:
        """The rows a round of compaction handled (None: it failed)."""
        threads = self.gateway.threads
        total = 0
        try:
            handled = COMPACT_CHUNK
            while handled >= COMPACT_CHUNK:
                fanned_out = await membership.fanned_out(self.gateway)
                spill_before = time.time() - SPILL_AFTER
                began = time.monotonic()
                retention = self.gateway.config.retention
                retained_since = round((time.time() - retention) * 1000) if retention else None
                handled = await threads.write(
                    threads.store.compact, COMPACT_CHUNK, fanned_out, spill_before, retained_since
                )
                total += handled
                await asyncio.sleep(time.monotonic() - began)
        except Exception:
            log.exception("compacting the store failed")
            return None
        return total

    async def _until_moved(self, seconds: float) -> bool:
        """Wait `seconds`, or less once the log's head or the feed moved (looked at every
        COMPACT_INTERVAL); whether they moved."""
        gateway = self.gateway
        seen = (gateway.ingest.head, gateway.hub.last_seq)
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            await asyncio.sleep(min(COMPACT_INTERVAL, left))
            if (gateway.ingest.head, gateway.hub.last_seq) != seen:
                return True
        return False
