"""The broker process: gateway listeners, delivery hub, group commit and the supervised pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from veil.config import Config
from veil.gateway.admission import Admission
from veil.gateway.ingest import Ingest
from veil.gateway.pipeline_process import PipelineProcess
from veil.gateway.rest import create_app
from veil.gateway.sessions import Close, DeliveryHub
from veil.gateway.storage import StoreThreads
from veil.gateway.tcp import start_tcp
from veil.gateway.websocket import create_ws_app
from veil.protocol import ProtocolError
from veil.security.identity import Authenticator, TokenVerifier
from veil.security.registry import Registry, load_registry_file, registry_from_json
from veil.security.tls import server_context
from veil.store import KIND_SUBSCRIBE, open_store

log = logging.getLogger("veil.gateway")
PROGRESS_INTERVAL = 0.1
QUARANTINE_INTERVAL = 1.0  # seconds between looks for newly quarantined entries
HEARTBEAT_STALE = 10.0  # seconds without a pipeline heartbeat after which it counts as stuck
STORE_FAILURE_SHOWN = 10.0  # seconds a failed store write keeps /health degraded
KEEPALIVE = 75.0  # seconds an HTTP connection may idle between requests (or sit on half a request)
COMPACT_INTERVAL = 2.0
COMPACT_CHUNK = 20000  # rows per transaction, so that compaction never holds the write lock for long
SPILL_AFTER = 2.0  # seconds a match may wait in the feed before it gets its own queue row


class Broker:
    def __init__(self, config: Config, run_pipeline: bool = True) -> None:
        self.config = config
        self.threads = StoreThreads(open_store(config.store_url))
        self.limits = config.limits
        self.admission = Admission(config.max_unauthenticated, config.read_timeout)
        self.parsing = ThreadPoolExecutor(1, thread_name_prefix="parse")  # large bodies, off the event loop
        self.ingest = Ingest(self.threads, config.max_pending, config.max_lag)
        self.hub = DeliveryHub(self.threads)
        self.pipeline = PipelineProcess(config) if run_pipeline else None
        self.registry = Registry()  # the newest version; the pipeline applies each in log order
        tokens = TokenVerifier(config.jwks, config.token_issuer, config.token_audience) if config.jwks else None
        self.auth = Authenticator(config.auth_methods, config.anonymous, tokens, lambda: self.registry)
        self.connections = 0
        self.pipeline_state = "starting"
        self.problems: list[str] = []  # why the pipeline side is degraded (store failures are added live)
        self.quarantined = 0
        self._quarantine_seq = 0  # the last quarantined entry whose subscriber was told
        self._quarantine_checked = 0.0
        self._tick = 0  # the offset of the last clock tick logged
        self.edges: dict[str, dict[int, Close]] = {}  # announcement id -> how to close its channels
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.Server] = []
        self._tcp: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def health(self) -> dict[str, object]:
        failing = self._store_failing()
        problems = self.problems if failing is None else [*self.problems, failing]
        return {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "pipeline": self.pipeline_state,
            "head": self.ingest.head,
            "processed": self.ingest.processed,
            "lag": self.ingest.lag,
            "quarantined": self.quarantined,
            "connections": self.connections,
            "subscriptionsConnected": len(self.hub.sessions),
        }

    @property
    def ready(self) -> bool:
        """Serving its promise: a pipeline alive and making progress, and a store that takes writes."""
        return self.pipeline_state == "running" and not self._store_failing()

    def _store_failing(self) -> str | None:
        failure = self.threads.failure
        if failure is None or time.monotonic() - failure[0] > STORE_FAILURE_SHOWN:
            return None
        return f"store writes failing ({time.monotonic() - failure[0]:.0f} s ago): {failure[1]}"

    async def start(self) -> None:
        config = self.config
        store = self.threads.store
        self.ingest.head = await self.threads.read(store.head_offset)
        self.ingest.processed = await self.threads.read(store.processed_offset)
        await self._load_registry()
        await self.hub.start()
        if self.pipeline is not None:
            await self.threads.write(store.set_status, "pipeline", 0)  # until the new pipeline reports
        context = None
        if config.tls:
            context = server_context(
                config.certificate,
                config.private_key,
                config.client_ca,
                config.client_cert == "required",  # type: ignore[arg-type]
            )
        loop = asyncio.get_running_loop()
        for app, port in ((create_app(self), config.port), (create_ws_app(self), config.ws)):
            runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE)
            await runner.setup()
            assert runner.server is not None
            server = await loop.create_server(
                self.admission.tracking(runner.server), config.bind, port, ssl=context, backlog=1024
            )
            self._servers.append(server)
            self._runners.append(runner)
        self._tcp = await start_tcp(self, config.bind, config.tcp, context)
        self._tasks = [
            asyncio.create_task(self.hub.poll()),
            asyncio.create_task(self.hub.save_cursors_periodically()),
            asyncio.create_task(self._track_progress()),
            asyncio.create_task(self._compact()),
        ]
        if self.pipeline is not None:
            self._tasks.append(asyncio.create_task(self.pipeline.supervise()))
        scheme = "https" if config.tls else "http"
        log.info(
            "veil listening: REST %s://%s:%d, TCP %d, WebSocket %d; store %s",
            scheme, config.bind, config.port, config.tcp, config.ws, config.store_url,
        )  # fmt: skip

    async def _load_registry(self) -> None:
        """A registry file applies when it is new or changed since it was last applied; otherwise the
        stored registry does, with the changes made through the admin API since."""
        store = self.threads.store
        if self.config.registry is not None:
            registry = load_registry_file(self.config.registry)
            digest = int.from_bytes(hashlib.sha256(registry.to_json()).digest()[:7], "big")
            applied = await self.threads.read(store.status, "registry_file")
            if applied is None or applied[0] != digest:
                await self.replace_registry(registry)
                await self.threads.write(store.set_status, "registry_file", digest)
                return
        stored = await self.threads.read(store.registry_at, None)
        if stored is not None:
            self.registry = registry_from_json(stored)

    async def replace_registry(self, registry: Registry) -> None:
        await self.threads.write(self.threads.store.put_registry, registry.to_json())
        self.registry = registry

    async def _track_progress(self) -> None:
        """Keep the figures that back-pressure and /health use fresh (the pipeline writes them)."""
        store = self.threads.store
        while True:
            try:
                self.ingest.processed = await self.threads.read(store.processed_offset)
                self.ingest.behind = (self.hub.behind(), len(self.hub.sessions))
                problems = await self._pipeline_problems()
                if time.monotonic() - self._quarantine_checked >= QUARANTINE_INTERVAL:
                    await self._follow_quarantine()
                if self.quarantined:
                    problems.append(f"{self.quarantined} log entries quarantined (see GET /admin/quarantine)")
                self.problems = problems
                await self._tick_when_due()
            except Exception as exc:
                log.exception("reading pipeline progress failed")
                self.problems = [f"cannot read the store: {exc}"]
            await asyncio.sleep(PROGRESS_INTERVAL)

    async def _pipeline_problems(self) -> list[str]:
        """The pipeline's state from what can be seen of it: its process (when this gateway runs it),
        the process id it registered, and its heartbeat (written every half second, with the start
        of the micro-batch it is in)."""
        store = self.threads.store
        pipeline = self.pipeline
        if pipeline is not None and not pipeline.alive:
            self.pipeline_state = "restarting"
            exited = "" if pipeline.exited is None else f" (exit code {pipeline.exited})"
            last = f": {pipeline.last_error}" if pipeline.last_error else ""
            return [f"the pipeline process is not running{exited}; restarting{last}"]
        registered = await self.threads.read(store.status, "pipeline")
        own = pipeline.process.pid if pipeline is not None and pipeline.process is not None else None
        if not registered or not registered[0] or (own is not None and registered[0] != own):
            self.pipeline_state = "starting"
            return ["the pipeline is starting"]
        heartbeat = await self.threads.read(store.status, "heartbeat")
        now = time.time()
        if heartbeat is None or now - heartbeat[1] > HEARTBEAT_STALE:
            silent = now - (heartbeat[1] if heartbeat else registered[1])
            self.pipeline_state = "stuck"
            return [f"no heartbeat from the pipeline for {silent:.0f} s"]
        if heartbeat[0] and now - heartbeat[0] / 1000 > self.config.batch_timeout:
            self.pipeline_state = "stuck"
            return [f"a micro-batch has been running for {now - heartbeat[0] / 1000:.0f} s"]
        self.pipeline_state = "running"
        return []

    async def _follow_quarantine(self) -> None:
        """Count what is quarantined, and tell the connected owner of a quarantined subscription."""
        store = self.threads.store
        self._quarantine_checked = time.monotonic()
        self.quarantined = await self.threads.read(store.quarantine_count)
        for record in await self.threads.read(store.quarantine, self._quarantine_seq):
            self._quarantine_seq = record.seq
            if record.kind == KIND_SUBSCRIBE and record.sub_id is not None:
                reason = ProtocolError("subscriptionId", f"quarantined by the broker: {record.error}", 422)
                await self.hub.kick(record.sub_id, reason.to_json())

    async def _tick_when_due(self) -> None:
        """A top-k/w window whose best publication expires promotes the next one at that moment,
        even if nothing is published: log the time once it is due, one tick per pipeline step."""
        due = await self.threads.read(self.threads.store.status, "topk_due")
        if due is not None and due[0] <= time.time() * 1000 and self._tick <= self.ingest.processed:
            self._tick = await self.threads.write(self.threads.store.append_tick)

    async def _compact(self) -> None:
        """Keep the store's size proportional to what is still queued, not to everything ever sent."""
        store = self.threads.store
        while True:
            try:
                while (
                    await self.threads.write(store.compact, COMPACT_CHUNK, self.hub.last_seq, time.time() - SPILL_AFTER)
                    >= COMPACT_CHUNK
                ):
                    pass
            except Exception:
                log.exception("compacting the store failed")
            await asyncio.sleep(COMPACT_INTERVAL)

    async def stop(self) -> None:
        """Stop taking work, commit what was accepted, save cursors, then stop the pipeline."""
        if self._tcp is not None:
            self._tcp.close()
        for server in self._servers:
            server.close()
        for runner in self._runners:
            await runner.shutdown()
        await self.ingest.drain()
        await self.hub.stop()
        for runner in self._runners:
            await runner.cleanup()
        if self.pipeline is not None:
            await self.pipeline.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.threads.close()
        self.parsing.shutdown(wait=False)


class _OneLine(logging.Filter):
    """A malformed HTTP request is the client's problem: one line in the log, not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args, record.exc_info = "malformed request from %s: %s", (remote, error.message), None
        return True


logging.getLogger("aiohttp.server").addFilter(_OneLine())


async def serve(config: Config) -> None:
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await broker.start()
    await stop.wait()
    log.info("stopping")
    await broker.stop()
    log.info("stopped")
