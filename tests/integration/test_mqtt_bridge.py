"""`veil bridge mqtt` with a real Mosquitto and a real broker: what MQTT acknowledged to its
publisher reaches the matching Veil subscribers once, across kill -9s of the bridge, and a Veil
subscription's deliveries reach an MQTT subscriber."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.integration.helpers import client_for, nothing_more, run_id, take
from tests.prerequisites import missing
from veil.harness import MosquittoServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mosquitto():
    try:
        server = MosquittoServer().start()
    except FileNotFoundError as exc:
        missing(str(exc), "VEIL_REQUIRE_MQTT")
    yield server
    server.stop()


class Bridge:
    """`veil bridge mqtt` as a process of its own, its log kept across restarts."""

    def __init__(self, broker, mosquitto, directory, *args: str, auth_hash: str = "bridge") -> None:
        self.command = [
            sys.executable, "-m", "veil.cli", "bridge", "mqtt", "--url", broker.url, "--auth-hash", auth_hash,
            "--tcp-port", str(broker.tcp_port), "--mqtt", mosquitto.url, "--client-id", f"bridge-{run_id()[:8]}",
            "--journal", os.path.join(directory, "bridge.journal"), *args,
        ]  # fmt: skip
        self.log_path = os.path.join(directory, "bridge.log")
        self.process: subprocess.Popen | None = None

    def start(self) -> Bridge:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stderr=log, stdout=log)
        return self

    async def subscribed(self, timeout: float = 30.0) -> Bridge:
        """Until the bridge's MQTT subscriptions are in: what is published before is no one's."""
        async with asyncio.timeout(timeout):
            while "MQTT subscribed to" not in self.log():
                assert self.process is not None and self.process.poll() is None, self.log()
                await asyncio.sleep(0.05)
        return self

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, self.log()
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()


class Publisher:
    """An MQTT client publishing at QoS 1; `acknowledged`: the numbers of the messages Mosquitto took."""

    def __init__(self, mosquitto) -> None:
        self.sent: list[tuple[int, mqtt.MQTTMessageInfo]] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sensor-{run_id()[:8]}")
        self.client.max_inflight_messages_set(100)
        self.client.connect("127.0.0.1", mosquitto.port)
        self.client.loop_start()

    def publish(self, topic: str, number: int, payload: dict, retain: bool = False) -> None:
        self.sent.append((number, self.client.publish(topic, orjson.dumps(payload), qos=1, retain=retain)))

    @property
    def acknowledged(self) -> set[int]:
        return {number for number, info in self.sent if info.is_published()}

    async def settled(self, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.acknowledged) < len(self.sent):
                await asyncio.sleep(0.05)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


async def readings(stream, count: int) -> list[dict]:
    return [d.publication for d in await take(stream, count, timeout=120)]


async def test_what_mqtt_acknowledged_reaches_veil_subscribers_once_across_kills_of_the_bridge(
    broker, mosquitto, tmp_path
):
    rid, total = run_id(), 1000
    bridge = (
        await Bridge(broker, mosquitto, str(tmp_path), "--topic", "site/{site}/floor/{floor:int}").start().subscribed()
    )
    publisher = Publisher(mosquitto)
    try:
        async with client_for(broker, "sam") as sam:
            run = {"key": "run", "val": rid, "op": "eq"}
            everything = (await sam.subscribe([run]))["subscriptionId"]
            upstairs = (await sam.subscribe([run, {"key": "floor", "val": 1, "op": "ge"}]))["subscriptionId"]
            async with sam.deliveries(everything) as all_of_it, sam.deliveries(upstairs) as above:

                def send(numbers, pause: float = 0.0) -> None:
                    for n in numbers:
                        # the payload's own "site" loses to the topic's: the topic is what MQTT's rules checked
                        publisher.publish(f"site/berth{n % 2}/floor/{n % 3}", n, {"run": rid, "n": n, "site": "x"})
                        time.sleep(pause)

                got: list[dict] = []

                async def collect() -> None:
                    async for delivery in all_of_it:
                        got.append(delivery.publication)

                async def until(count: int) -> None:
                    async with asyncio.timeout(120):
                        while len(got) < count:
                            await asyncio.sleep(0.01)

                collecting = asyncio.create_task(collect())
                send(range(300))
                await until(300)

                # a group in flight when the bridge dies: Veil holds its request (the gateway stopped), the
                # bridge is killed with it unanswered, and MQTT sends the group again to the next bridge
                os.kill(broker.process.pid, signal.SIGSTOP)
                try:
                    send(range(300, 350))
                    await asyncio.sleep(1.0)
                    bridge.kill()
                finally:
                    os.kill(broker.process.pid, signal.SIGCONT)
                bridge.start()
                # and killed again while readings stream through it (one every 2 ms)
                sending = asyncio.create_task(asyncio.to_thread(send, range(350, total), 0.002))
                await until(500)
                bridge.kill()
                await asyncio.sleep(0.5)
                bridge.start()
                await sending
                await publisher.settled()
                assert publisher.acknowledged == set(range(total))

                await until(total)
                await asyncio.sleep(1.5)  # nothing more comes
                collecting.cancel()
                assert [p["n"] for p in got] == list(range(total))  # once each, in MQTT's order
                assert {(p["site"], p["floor"]) for p in got} == {(f"berth{n % 2}", n % 3) for n in range(total)}
                wanted = [n for n in range(total) if n % 3 >= 1]
                assert [p["n"] for p in await readings(above, len(wanted))] == wanted
                await nothing_more(above)
        assert "came again: published under its key" in bridge.log()  # the held group was sent again
    finally:
        bridge.stop()
        publisher.close()
    assert "stopped:" in bridge.log()


async def test_messages_veil_cannot_take_are_acknowledged_and_do_not_hold_back_the_rest(broker, mosquitto, tmp_path):
    rid = run_id()
    bridge = (
        await Bridge(broker, mosquitto, str(tmp_path), "--topic", "bad/{n:int}", "--topic", "t/{kind}")
        .start()
        .subscribed()
    )
    publisher = Publisher(mosquitto)
    try:
        async with client_for(broker, "sam") as sam:
            sub = (await sam.subscribe([{"key": "value", "val": rid, "op": "eq"}]))["subscriptionId"]
            async with sam.deliveries(sub) as stream:
                publisher.client.publish("bad/seven", orjson.dumps({"run": rid}), qos=1)  # not the int asked for
                publisher.client.publish("t/bytes", b"\xff\xfe", qos=1)  # neither JSON nor text
                deep = b'{"run": "%s", "a": %s1%s}' % (rid.encode(), b"[" * 40, b"]" * 40)
                publisher.client.publish("t/deep", deep, qos=1)  # deeper than Veil takes
                scoped = orjson.dumps({"veil:scope": "ops", "value": rid})  # a device does not choose a scope
                publisher.client.publish("t/scope", scoped, qos=1)
                publisher.client.publish("t/text", b"21.5", qos=1)
                publisher.client.publish("t/word", rid.encode(), qos=1)  # text: a string value
                assert [d.publication for d in await take(stream, 1)] == [{"value": rid, "kind": "word"}]
        bridge.stop()
        log = bridge.log()
        assert log.count("not published (acknowledged and dropped)") == 4, log
        assert "stopped: 6 MQTT messages received, 2 published into Veil (0 again after a reconnect), 4 rejected" in log
    finally:
        bridge.stop()
        publisher.close()


async def test_a_retained_message_is_published_once_not_at_every_reconnect(broker, mosquitto, tmp_path):
    rid = run_id()
    publisher = Publisher(mosquitto)
    publisher.publish(f"retained/{rid}", 0, {"value": rid}, retain=True)
    await publisher.settled()
    bridge = Bridge(broker, mosquitto, str(tmp_path), "--topic", "retained/{run}")
    try:
        async with client_for(broker, "sam") as sam:
            sub = (await sam.subscribe([{"key": "value", "val": rid, "op": "eq"}]))["subscriptionId"]
            async with sam.deliveries(sub) as stream:
                await bridge.start().subscribed()
                assert [d.publication for d in await take(stream, 1)] == [{"value": rid, "run": rid}]
                for _ in range(2):  # restarted, and its subscriptions made again on the resumed session
                    bridge.stop()
                    bridge.start()
                    await asyncio.sleep(2.0)
                await nothing_more(stream)
    finally:
        bridge.stop()
        publisher.client.publish(f"retained/{rid}", b"", qos=1, retain=True)  # the retained message cleared
        publisher.close()
    assert bridge.log().count("MQTT subscribed to") == 3


async def test_a_subscriptions_deliveries_reach_an_mqtt_subscriber(broker, mosquitto, tmp_path):
    rid = run_id()
    received: list[tuple[str, dict]] = []
    listener = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"listener-{rid[:8]}")
    listener.on_message = lambda _c, _u, m: received.append((m.topic, orjson.loads(m.payload)))
    listener.connect("127.0.0.1", mosquitto.port)
    listener.subscribe("alerts/#", qos=1)
    listener.loop_start()
    async with client_for(broker, "bridge") as own, client_for(broker, "pia") as publisher:
        sub = (await own.subscribe([{"key": "run", "val": rid, "op": "eq"}], f"alerts-{rid}"))["subscriptionId"]
        bridge = Bridge(broker, mosquitto, str(tmp_path), "--deliver", f"{sub}=alerts/{{site}}/{{level}}").start()
        try:
            sites = ["north", "south", "a/b/+/#", ""]  # a site that would climb the topic tree stays one level
            for n in range(40):
                await publisher.publish({"run": rid, "n": n, "site": sites[n % 4], "level": n % 2 == 0})
            async with asyncio.timeout(60):
                while len(received) < 40:
                    await asyncio.sleep(0.05)
            bridge.kill()
            for n in range(40, 60):
                await publisher.publish({"run": rid, "n": n, "site": "north", "level": 1})
            bridge.start()
            async with asyncio.timeout(60):
                while len({p["n"] for _, p in received}) < 60:
                    await asyncio.sleep(0.05)
        finally:
            bridge.stop()
            listener.loop_stop()
            listener.disconnect()
    first = {p["n"]: topic for topic, p in received[:40]}
    assert [p["n"] for _, p in received[:40]] == list(range(40))
    assert first[0] == "alerts/north/true" and first[1] == "alerts/south/false"
    assert first[2] == "alerts/a%2Fb%2F%2B%2F%23/true" and first[3] == "alerts//false"
    assert sorted({p["n"] for _, p in received}) == list(range(60))
    # after the kill, at most what was in flight comes twice (MQTT's QoS 1 is at least once)
    assert len(received) - 60 <= 1
    assert {topic for topic, p in received if p["n"] >= 40} == {"alerts/north/1"}
