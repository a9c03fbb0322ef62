"""The gateway's figures in Prometheus' exposition format (`GET /metrics`, SPEC §8).

Counters are incremented where the work happens (publications as they are acknowledged, answers by
status as the error middleware writes them); what the gateway already keeps for /health (the log's
head and progress, the pipeline's lag and state, connections, the quarantine) is read at scrape
time by a collector, so that /health and /metrics never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PIPELINE_STATES = ("starting", "running", "restarting", "stuck")


class _HealthFigures(Collector):
    def __init__(self, report: Callable[[], dict[str, object]]) -> None:
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        report = self._report()
        for name, key, text in (
            ("veil_log_head", "head", "offset of the newest entry in the event log"),
            ("veil_log_processed", "processed", "offset up to which the pipeline has matched the log"),
            ("veil_pipeline_lag", "lag", "log entries the pipeline has yet to match"),
            ("veil_quarantined", "quarantined", "log entries the pipeline set aside"),
            ("veil_connections", "connections", "open delivery connections (TCP and WebSocket)"),
            ("veil_subscriptions_connected", "subscriptionsConnected", "subscriptions with a delivery connection"),
        ):
            yield GaugeMetricFamily(name, text, value=float(report[key]))  # type: ignore[arg-type]
        state = GaugeMetricFamily("veil_pipeline_state", "the pipeline's state (gateway's view)", labels=["state"])
        for name in PIPELINE_STATES:
            state.add_metric([name], 1.0 if report["pipeline"] == name else 0.0)
        yield state


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

    def watch(self, report: Callable[[], dict[str, object]]) -> None:
        self.registry.register(_HealthFigures(report))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
