"""The gateway's figures in Prometheus' exposition format (`GET /metrics`, SPEC §8).

Counters this gateway keeps are incremented where the work happens (publications as they are
acknowledged, answers by status as the error middleware writes them); what the gateway already
keeps for /health (the log's head and progress, the pipeline's lag and state, connections, the
quarantine) is read at scrape time, so that /health and /metrics never disagree; the delivery hub's
queues and its publish -> delivery latency histogram are read from the hub. The deployment's totals
and the durations of the pipeline's rounds live in the store: they are read at most once a second
however often anyone scrapes, so that scraping cannot load the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from veil.monitoring.figures import StoreFigures
from veil.monitoring.histogram import Histogram, family
from veil.store import BATCH_BOUNDS_MS, DEAD_LETTER_REASONS

log = logging.getLogger("veil.gateway")
PIPELINE_STATES = ("starting", "running", "restarting", "stuck")
STORE_FRESH = 1.0  # seconds the store's figures are reused for


class Queued(Protocol):
    @property
    def queued(self) -> int:
        """Bytes of delivery lines in memory."""
        ...


class Hub(Protocol):
    """What /metrics reads of the gateway's delivery hub."""

    @property
    def quotas(self) -> Queued: ...

    @property
    def latency(self) -> Histogram: ...

    def queued(self) -> int: ...

    def behind(self) -> int: ...

    def judged_clients_behind(self) -> tuple[int, int, int]: ...

    def observe_latency(self) -> None: ...


class _Figures(Collector):
    def __init__(self, report: Callable[[], dict[str, object]], hub: Hub) -> None:
        self._report = report
        self._hub = hub
        self.stored: StoreFigures | None = None

    def collect(self) -> Iterator[Metric]:
        yield from self._health()
        yield from self._hub_figures()
        if self.stored is not None:
            yield from self._store_figures(self.stored)

    def _health(self) -> Iterator[Metric]:
        report = self._report()
        for name, key, text in (
            ("veil_log_head", "head", "offset of the newest entry in the event log"),
            ("veil_log_processed", "processed", "offset up to which the pipeline has matched the log"),
            ("veil_pipeline_lag", "lag", "log entries the pipeline has yet to match"),
            ("veil_quarantined", "quarantined", "log entries the pipeline set aside"),
            ("veil_connections", "connections", "open delivery connections (TCP and WebSocket)"),
            ("veil_subscriptions_connected", "subscriptionsConnected", "subscriptions with a delivery connection"),
        ):
            yield GaugeMetricFamily(name, text, value=float(report[key]))  # type: ignore[arg-type]  # these are counts
        dark = report["darkPartitions"]
        yield GaugeMetricFamily(
            "veil_pipeline_partitions_dark", "matcher partitions without a running task (the driver's view)",
            value=float(len(dark) if isinstance(dark, list) else 0),
        )  # fmt: skip
        state = GaugeMetricFamily("veil_pipeline_state", "the pipeline's state (gateway's view)", labels=["state"])
        for name in PIPELINE_STATES:
            state.add_metric([name], 1.0 if report["pipeline"] == name else 0.0)
        yield state

    def _hub_figures(self) -> Iterator[Metric]:
        hub = self._hub
        yield GaugeMetricFamily(
            "veil_session_queue_depth", "deliveries queued in this gateway's memory for connected subscriptions",
            value=float(hub.queued()),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "veil_sessions_behind", "connected subscriptions reading their backlog from the store",
            value=float(hub.behind()),
        )  # fmt: skip
        behind, connected, not_reading = hub.judged_clients_behind()  # as publishes see it
        yield GaugeMetricFamily(
            "veil_clients_behind", "connected clients most of whose subscriptions read their backlog from the store",
            value=float(behind),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "veil_clients_connected", "clients with a delivery connection whose client reads", value=float(connected)
        )  # fmt: skip
        yield GaugeMetricFamily(
            "veil_clients_not_reading",
            "clients with delivery connections, each with a write waiting for its client (left out of the two above)",
            value=float(not_reading),
        )  # fmt: skip
        queued = float(hub.quotas.queued)
        yield GaugeMetricFamily("veil_queued_bytes", "bytes of delivery lines queued in memory", value=queued)
        hub.observe_latency()
        yield hub.latency.family(
            "veil_delivery_latency_seconds",
            "from a publication's acknowledgement to its delivery being written to a subscriber's connection "
            "(deliveries taken live from the pipeline's feed)",
        )

    def _store_figures(self, stored: StoreFigures) -> Iterator[Metric]:
        totals, batches = stored
        for name, value, text in (
            ("veil_received_publications", totals.received, "publications acknowledged by every gateway of the store"),
            ("veil_matched_publications", totals.matched, "publications that matched at least one subscription"),
            ("veil_matches", totals.matches, "deliveries queued: (publication, subscription) pairs"),
            ("veil_deliveries", totals.forwarded, "deliveries sent to subscribers (again after a reconnect)"),
            ("veil_dead_letters_expired", totals.dead_letters_expired, "dead letters dropped past the age bound"),
        ):
            yield CounterMetricFamily(name, text + " (kept in the store: survives restarts)", value=float(value))
        for name, value, text in (
            ("veil_subscriptions", totals.subscriptions, "live subscriptions"),
            ("veil_subscribers", totals.subscribers, "distinct owners of live subscriptions"),
            ("veil_queued_deliveries", totals.queued,
             "deliveries queued and not yet sent, store-wide (a lower bound: resends count as sent)"),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, text, value=float(value))
        dead = CounterMetricFamily(
            "veil_dead_lettered",
            "deliveries that left their subscription's queue for its dead letters, by the bound they were past "
            "(kept in the store: survives restarts)",
            labels=["reason"],
        )
        for reason, count in zip(DEAD_LETTER_REASONS, totals.dead_lettered, strict=True):
            dead.add_metric([reason], float(count))
        yield dead
        yield family(
            "veil_batch_duration_seconds",
            "the pipeline's rounds, from reading the log to recording the round, as the matcher task timed them",
            [bound / 1000 for bound in BATCH_BOUNDS_MS], batches.counts, batches.total_ms / 1000,
        )  # fmt: skip
        yield CounterMetricFamily(
            "veil_pipeline_state_builds",
            "matcher partition states built from the store (a new or restarted Python worker, or a partition "
            "that moved to another one), counted with the round that used them: each costs a read of the "
            "partition's subscriptions",
            value=float(batches.state_builds),
        )  # fmt: skip


class Metrics:
    """One registry per gateway (not prometheus-client's global one), so that gateways built in one
    process, as tests do, count apart."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.publications = Counter(
            "veil_publications", "publications acknowledged (durable in the log)", registry=self.registry
        )
        self.responses = Counter(
            "veil_http_responses", "REST answers by route and status (503: load shed)", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self._figures: _Figures | None = None
        self._read: Callable[[], Awaitable[StoreFigures]] | None = None
        self._read_at = -STORE_FRESH
        self._reading = asyncio.Lock()

    def watch(
        self, report: Callable[[], dict[str, object]], hub: Hub, read: Callable[[], Awaitable[StoreFigures]]
    ) -> None:
        self._figures = _Figures(report, hub)
        self._read = read
        self.registry.register(self._figures)

    async def exposition(self) -> bytes:
        if self._figures is not None and self._read is not None and time.monotonic() - self._read_at >= STORE_FRESH:
            async with self._reading:  # scrapes arriving together share one read
                if time.monotonic() - self._read_at >= STORE_FRESH:
                    self._read_at = time.monotonic()
                    try:
                        self._figures.stored = await self._read()
                    except Exception:  # the store's figures stay as last read; /health says why
                        log.exception("reading the store's figures for /metrics failed")
        return generate_latest(self.registry)
