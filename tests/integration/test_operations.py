"""Operating a live broker, as its operators' tools see it (one broker for the module):

- the SELIS monitoring channel (seed 000 §6.1) as a monitoring client speaks it: its authHash in the
  handshake, a message every interval with the state, the totals and the rates, over WebSocket and
  TCP; totals that match the traffic exactly and survive a restart; the wrong hash gets nothing;
- /metrics with the pipeline's figures, and the /dashboard in a real browser (headless Chromium)
  plotting the traffic and showing what /metrics says;
- the OpenAPI document, kept true by schemathesis against the broker (last: it leaves junk behind).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, client_for, run_id, take
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
SECRET = "monitoring-secret-1"
# the figures the dashboard shows as numbers, by their names in /metrics
FIGURES = {"veil_pipeline_lag", "veil_connections", "veil_subscriptions", "veil_queued_deliveries",
           "veil_received_publications_total", "veil_deliveries_total"}  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("monitoring")
    (directory / "monitoring.conf").write_text(SECRET + "\n")
    process = BrokerProcess(
        str(directory / "data"), "--metrics-auth-hash-file", str(directory / "monitoring.conf"),
        "--metrics-interval", "1",
    ).start()  # fmt: skip
    yield process
    process.close()


class Monitor:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def next(self) -> dict:
        message = await self.ws.receive(timeout=30)
        return orjson.loads(message.data)


async def test_a_monitoring_client_gets_totals_and_rates_at_the_interval(broker):
    rid = run_id()
    async with aiohttp.ClientSession() as session, session.ws_connect(f"ws://127.0.0.1:{broker.ws_port}/") as ws:
        await ws.send_str(orjson.dumps({"authHash": SECRET}).decode())
        monitor = Monitor(ws)
        first = await monitor.next()
        assert set(first) == {"timestamp", "state", "operations", "performance"}
        assert set(first["state"]) == {"subscribers", "subscriptions", "connections", "queued"}
        async with client_for(broker, "watched") as client:
            sub = (await client.subscribe([{"key": "rid", "op": "eq", "val": rid}, {"key": "n", "op": "lt", "val": 5}]))
            async with client.deliveries(sub["subscriptionId"]) as stream:
                await stream.connected.wait()
                for n in range(8):
                    await client.publish({"rid": rid, "n": n})
                await take(stream, 5)
                messages = []
                while True:
                    report = await monitor.next()
                    messages.append(report)
                    grown = {k: report["operations"][k] - first["operations"][k] for k in report["operations"]}
                    if grown == {"received": 8, "matched": 5, "forwarded": 5}:
                        break
                    assert grown["received"] <= 8 and grown["matched"] <= 5 and grown["forwarded"] <= 5
                assert report["state"]["subscriptions"] >= first["state"]["subscriptions"] + 1
                assert report["state"]["connections"] >= 2  # the subscriber and this monitor
        stamps = [first["timestamp"], *(m["timestamp"] for m in messages)]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert all(800 < gap < 2000 for gap in gaps), gaps  # every second, as configured
        counted = sum(
            m["performance"]["receiveRate"] * (b - a) / 1000 for m, (a, b) in zip(messages, itertools.pairwise(stamps), strict=True)
        )
        assert abs(counted - 8) < 0.5, counted  # the rates account for what was published


async def test_the_tcp_port_serves_it_too_and_the_wrong_hash_gets_nothing(broker):
    monitor = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    report = await monitor.line()
    assert report is not None and "operations" in report
    monitor.close()
    stranger = await LineConnection.open(broker.tcp_port, {"authHash": "monitoring-secret-2"})
    refusal = await stranger.line()
    assert refusal is not None and refusal["status"] == 400 and "operations" not in refusal
    assert await stranger.silent()
    stranger.close()


async def test_totals_survive_a_restart(broker):
    before = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    totals = (await before.line())["operations"]
    before.close()
    assert totals["received"] >= 8
    broker.stop()
    broker.start()
    after = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    assert (await after.line())["operations"] == totals
    after.close()


async def until(check: Callable[[], object], timeout: float = 30.0, what: str | Callable[[], str] = "") -> None:
    """Until `check()` holds; `what` names it in the failure, or says what was last seen (a callable)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {(what() if callable(what) else what) or check}"
        await asyncio.sleep(0.25)


async def test_metrics_carry_the_pipeline_figures(broker):
    before = broker.metrics()
    rid = run_id()
    async with client_for(broker, "measured") as client:
        sub = await client.subscribe([{"key": "rid", "op": "eq", "val": rid}])
        async with client.deliveries(sub["subscriptionId"]) as stream:
            await stream.connected.wait()

            def taking_offers() -> bool:
                """Attached and caught up: from here on its deliveries are taken live from the feed, the
                ones the latency histogram counts (a backlog read after connecting is not)."""
                return broker.health()["subscriptionsConnected"] >= 1 and broker.metrics()["veil_sessions_behind"] == 0

            await until(taking_offers, what="the subscription attached and caught up")
            for n in range(6):
                await client.publish({"rid": rid, "n": n})
            await take(stream, 6)

    def counted() -> bool:
        """The deliveries are counted as they are sent; a batch's duration when Spark has reported
        it and the pipeline's next heartbeat has taken it to the store."""
        now = broker.metrics()
        return now["veil_deliveries_total"] - before["veil_deliveries_total"] == 6 and (
            now["veil_batch_duration_seconds_count"] >= 1
        )

    await until(counted, what="the deliveries and a micro-batch counted in /metrics")
    after = broker.metrics()
    grown = {name: after[name] - before.get(name, 0) for name in after}
    assert grown["veil_received_publications_total"] == grown["veil_matches_total"] == 6
    assert grown["veil_delivery_latency_seconds_count"] == 6
    assert 0 < grown["veil_delivery_latency_seconds_sum"] < 6 * 30
    assert after["veil_batch_duration_seconds_count"] >= 1 and after["veil_batch_duration_seconds_sum"] > 0
    assert after['veil_pipeline_state{state="running"}'] == 1


async def test_the_dashboard_plots_the_traffic_and_shows_what_metrics_says(broker, browser, tmp_path):
    await asyncio.to_thread(browser.get, broker.url + "/dashboard")
    reads = lambda: browser.execute_script("return window.veil ? window.veil.reads : 0")  # noqa: E731
    await until(lambda: reads() >= 2, what="the page reading /metrics")
    rid = run_id()
    async with client_for(broker, "dashboard") as client:
        sub = await client.subscribe([{"key": "rid", "op": "eq", "val": rid}])
        async with client.deliveries(sub["subscriptionId"]) as stream:
            await stream.connected.wait()
            for n in range(40):
                await client.publish({"rid": rid, "n": n})
                await asyncio.sleep(0.1)
            await take(stream, 40)
            moved = "return ['received', 'delivered', 'p50'].every(s => window.veil.series[s].some(v => v > 0))"
            await until(lambda: browser.execute_script(moved), what="the rate and latency plots to move")
            await asyncio.to_thread(browser.save_screenshot, str(tmp_path / "dashboard.png"))
            shown_p99 = float(browser.find_element("css selector", '[data-quantile="0.99"]').text.replace(",", ""))
    assert (tmp_path / "dashboard.png").stat().st_size > 20_000
    latency = broker.metrics()
    total = latency["veil_delivery_latency_seconds_count"]
    holds_all = min(float(key.split('"')[1]) for key, count in latency.items()
                    if key.startswith("veil_delivery_latency_seconds_bucket") and count == total)  # fmt: skip
    assert 0 < shown_p99 <= holds_all * 1000  # what the page computed lies within what /metrics counted

    compared: dict[str, dict] = {}

    def agrees() -> bool:
        """With the traffic over, every figure the page shows equals /metrics, read after the page's
        next read (they differ while a gauge moves between the two, hence the retries)."""
        before, deadline = reads(), time.monotonic() + 10
        while reads() == before:
            assert time.monotonic() < deadline, "the page stopped reading /metrics"
            time.sleep(0.1)
        shown = {
            element.get_attribute("data-metric"): element.text.replace(",", "")
            for element in browser.find_elements("css selector", "[data-metric]")
        }
        exposed = broker.metrics()
        compared.update(shown=shown, exposed={name: exposed.get(name) for name in shown})
        assert set(shown) >= FIGURES, f"the page shows no figure for {sorted(FIGURES - set(shown))}"
        return all(re.fullmatch(r"-?[0-9]+", text) and float(text) == exposed.get(name) for name, text in shown.items())

    await until(agrees, what=lambda: f"the figures shown to equal /metrics, last {compared}")


def test_the_openapi_document_holds_for_every_endpoint(broker, tmp_path):
    """schemathesis generates requests for every operation the document describes, valid and not,
    and checks each answer: no server error, and status, media type, headers and body as documented."""
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance," \
        "response_schema_conformance"  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", broker.url + "/openapi.json", "--checks", checks,
         "--max-examples", "25", "--seed", "2026", "--workers", "1", "--request-timeout", "30",
         "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert "Tested: 24" in result.stdout, result.stdout[-3000:]
