"""The broker process: it builds the gateway's parts, puts them behind the listeners, starts the
background loops (and the supervised pipeline) and stops it all in order. It wires; the work is in
the parts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from veil.config import Config
from veil.gateway import membership, memory
from veil.gateway.background import Background
from veil.gateway.channel import EdgeChannels
from veil.gateway.context import Gateway
from veil.gateway.credential_watch import CredentialWatch
from veil.gateway.delivery import DeliveryHub
from veil.gateway.errors import json_parse_errors
from veil.gateway.health import Health
from veil.gateway.ingest import Ingest
from veil.gateway.monitor import read_hash, store_figures
from veil.gateway.pipeline_process import PipelineProcess
from veil.gateway.quotas import Quotas
from veil.gateway.registry import CurrentRegistry
from veil.gateway.rest import create_app
from veil.gateway.store_threads import StoreThreads
from veil.gateway.tcp import start_tcp
from veil.gateway.unproven import Unproven
from veil.gateway.websocket import create_ws_app
from veil.monitoring import trace
from veil.monitoring.metrics import Metrics
from veil.security.identity import Authenticator, TokenVerifier
from veil.security.revocation import RevocationList
from veil.security.tls import server_context
from veil.store import open_store
from veil.store.credentials import redacted

log = logging.getLogger("veil.gateway")
KEEPALIVE = 75.0  # seconds an HTTP connection may idle between requests (or sit on half a request)


def build_gateway(config: Config) -> Gateway:
    threads = StoreThreads(open_store(config.store_url))
    hub = DeliveryHub(
        threads, quotas=Quotas(config.max_client_connections, config.max_client_queued, config.max_queued)
    )
    keys_kept = round(config.idempotency_window * 1000)
    ingest = Ingest(threads, config.max_pending, config.max_lag, hub.judged_clients_behind, keys_kept)
    parsing = ThreadPoolExecutor(1, thread_name_prefix="parse")
    registry = CurrentRegistry(threads, parsing, config.max_registry)
    tokens = TokenVerifier(config.jwks, config.token_issuer, config.token_audience) if config.jwks else None
    revoked = RevocationList(config.crl, config.client_ca).revoked if config.crl and config.client_ca else None
    health = Health(threads, ingest, hub)
    metrics = Metrics()
    gateway = Gateway(
        config=config,
        limits=config.limits,
        threads=threads,
        ingest=ingest,
        hub=hub,
        auth=Authenticator(config.auth_methods, config.anonymous, tokens, lambda: registry.current, revoked),
        registry=registry,
        unproven=Unproven(config.max_unauthenticated, config.read_timeout),
        parsing=parsing,
        edges=EdgeChannels(),
        credentials=CredentialWatch(),
        health=health,
        metrics=metrics,
        metrics_hash=read_hash(config.metrics_auth_hash_file),
    )
    metrics.watch(health.report, hub, functools.partial(store_figures, gateway))
    return gateway


class Broker:
    """The gateway with its listeners, and the pipeline unless `run_pipeline` is False (the gateway
    alone: another process runs the pipeline, or a test serves requests without one)."""

    def __init__(self, config: Config, run_pipeline: bool = True) -> None:
        self.config = config
        self.gateway = build_gateway(config)
        self.pipeline = PipelineProcess(config) if run_pipeline else None
        self.background = Background(self.gateway, self.pipeline)
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.Server] = []

    async def prepare(self) -> None:
        """Read what the gateway resumes from: the log's head and progress, the registry, the feed."""
        gateway, config = self.gateway, self.config
        threads = gateway.threads
        gateway.ingest.head = await threads.read(threads.store.head_offset)
        gateway.ingest.processed = await threads.read(threads.store.processed_offset)
        await gateway.hub.start()
        await membership.start(gateway)  # first: a gateway refused its name changes nothing
        await gateway.registry.load(config.registry)
        if self.pipeline is not None:
            await threads.write(threads.store.expect_pipeline)  # until the new pipeline registers

    async def start(self) -> None:
        await self.prepare()
        gateway, config = self.gateway, self.config
        context = None
        certificate, private_key = config.certificate, config.private_key  # both or neither (Config checks)
        if certificate is not None and private_key is not None:
            context = server_context(
                certificate,
                private_key,
                config.client_ca,
                config.client_cert == "required",
            )
        loop = asyncio.get_running_loop()
        for app, port in ((create_app(gateway), config.port), (create_ws_app(gateway), config.ws)):
            runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE)
            await runner.setup()
            assert runner.server is not None
            server = await loop.create_server(
                gateway.unproven.tracking(json_parse_errors(runner.server)),
                config.bind,
                port,
                ssl=context,
                backlog=1024,
            )
            self._servers.append(server)
            self._runners.append(runner)
        self._servers.append(await start_tcp(gateway, config.bind, config.tcp, context))
        self.background.start()
        scheme = "https" if config.tls else "http"
        log.info(
            "veil listening: REST %s://%s:%d, TCP %d, WebSocket %d; store %s",
            scheme, config.bind, config.port, config.tcp, config.ws, redacted(config.store_url),
        )  # fmt: skip

    async def stop(self) -> None:
        """Stop taking work, commit what was accepted, save cursors, then stop the pipeline."""
        gateway = self.gateway
        for server in self._servers:
            server.close()
        for runner in self._runners:
            await runner.shutdown()
        await gateway.ingest.drain()
        await gateway.hub.stop()
        for runner in self._runners:
            await runner.cleanup()
        await self.background.stop()
        with contextlib.suppress(Exception):  # otherwise its row lapses: others wait for it a little longer
            await membership.leave(gateway)
        gateway.threads.close()
        gateway.parsing.shutdown(wait=False)


class _OneLine(logging.Filter):
    """A malformed HTTP request is the client's problem: one line in the log, not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args, record.exc_info = "malformed request from %s: %s", (remote, error.message), None
        return True


logging.getLogger("aiohttp.server").addFilter(_OneLine())


def announce_profile(config: Config) -> None:
    """Say at start what a newcomer would otherwise find out from a 401: how clients get in."""
    if config.dev:
        log.warning(
            "development profile (--dev): any claimed authHash is an identity, anonymous clients are let in%s; "
            "do not run it where anyone else can reach it",
            "" if config.with_authorization else " and everyone receives everything",
        )
    elif config.registry is None:
        log.info(
            "no --registry given: clients prove themselves with certificates (%s) or tokens, and receive only "
            "what the stored registry's rules allow; give --registry FILE (users, rules, static hashes: see "
            "the README's Trust section), or --dev to try the SELIS examples",
            "--client-ca" if config.client_ca is None else config.client_ca,
        )


async def serve(config: Config) -> None:
    announce_profile(config)
    memory.map_large_allocations()
    trace.buffer_until_exit()
    broker = Broker(config, run_pipeline=config.role == "all")
    gateway = broker.gateway
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, gateway.stop.set)
    await broker.start()
    await gateway.stop.wait()
    log.info("stopping")
    await broker.stop()
    log.info("stopped")
    if gateway.replaced.is_set():
        raise ValueError(f"--gateway-id {config.gateway_name}: another gateway took this id over; give each its own")
