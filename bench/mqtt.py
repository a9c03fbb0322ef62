"""MQTT → Veil → subscriber through `veil bridge mqtt`, beside its two baselines on the same machine.

Each rate is run three ways, each one subscription that takes every reading, each from processes of
its own:

    mosquitto alone   an MQTT publisher (QoS 1) → Mosquitto → an MQTT subscriber: what MQTT costs
    veil over REST    the bench's HTTP publisher (16 connections) → Veil → a TCP subscriber
    mqtt → veil       the MQTT publisher → Mosquitto → the bridge → Veil → the TCP subscriber

A reading carries its send time; latency is the subscriber's receive time minus it. "held" is
readings acknowledged to the publisher per second (by Mosquitto's PUBACK, or Veil's 200); "through"
is readings delivered per second, from the first send to the last delivery; a rate of 0 is as fast
as the publisher's window (100 QoS 1 messages in flight) lets it. The bridge's CPU per reading is
read from /proc over its run.

    python -m bench.mqtt [--rates 500,1000,2000,0] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import orjson

from bench.brokers import add_broker_arguments, benched_broker
from bench.cpu import cpu_seconds
from bench.latency import _percentiles
from bench.loadgen import Processes, lat_lon
from veil.client import VeilClient
from veil.harness import MosquittoServer

WINDOW = 100  # QoS 1 messages the MQTT publisher has in flight at most


def _mqtt_publish(queue, port: int, run: str, seconds: float, rate: float) -> None:
    """Publish readings at `rate` (0: as fast as the window allows) for `seconds`; report
    (acknowledged, started, finished)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    acked = threading.Semaphore(0)
    window = threading.Semaphore(WINDOW)

    def published(*_: object) -> None:
        acked.release()
        window.release()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-publisher-{run[:8]}")
    client.max_inflight_messages_set(WINDOW)
    client.on_publish = published
    client.connect("127.0.0.1", port)
    client.loop_start()
    started = time.time()
    begin, sent, rng = time.monotonic(), 0, random.Random(0)
    while time.monotonic() - begin < seconds:
        window.acquire()
        reading = lat_lon(rng, run)
        client.publish(f"readings/site{sent % 4}", orjson.dumps(reading), qos=1)
        sent += 1
        if rate:
            time.sleep(max(0.0, begin + sent / rate - time.monotonic()))
    finished = time.time()
    count = 0
    deadline = time.monotonic() + 30
    while count < sent and acked.acquire(timeout=max(0.0, deadline - time.monotonic())):
        count += 1
    client.loop_stop()
    client.disconnect()
    queue.put(("published", count, started, finished))


def _mqtt_listen(queue, ready, port: int, run: str, seconds: float) -> None:
    """Subscribe to the readings over MQTT and report their latencies."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    latencies: list[float] = []
    last = [0.0]

    def arrived(_client: object, _userdata: object, message: mqtt.MQTTMessage) -> None:
        last[0] = time.time()
        latencies.append(last[0] - orjson.loads(message.payload)["t"])

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-listener-{run[:8]}")
    client.on_message = arrived
    client.on_subscribe = lambda *_: ready.set()
    client.connect("127.0.0.1", port)
    client.subscribe("readings/#", qos=1)
    client.loop_start()
    deadline = time.monotonic() + seconds
    seen, quiet = 0, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if len(latencies) != seen:
            seen, quiet = len(latencies), time.monotonic()
        elif seen and time.monotonic() - quiet > 3:
            break
    client.loop_stop()
    client.disconnect()
    queue.put(("listened", latencies, last[0]))


def _figures(
    held: float, latencies: list[float], expected: int, started: float, last: float, cpu: float | None = None
) -> dict:
    p50, p99 = _percentiles(np.array(latencies) * 1000)
    return {
        "held": held,
        "through": len(latencies) / (last - started) if last > started else float("nan"),
        "p50": p50,
        "p99": p99,
        "delivered": len(latencies),
        "expected": expected,
        "cpu_us": cpu,
    }


def mosquitto_alone(mosquitto: MosquittoServer, rate: float, seconds: float) -> dict:
    processes = Processes()
    run = os.urandom(8).hex()
    ready = processes.context.Event()
    listener = processes.context.Process(target=_mqtt_listen, args=(processes.queue, ready, mosquitto.port, run,
                                                                    seconds + 30))  # fmt: skip
    listener.start()
    ready.wait(30)
    publisher = processes.context.Process(target=_mqtt_publish, args=(processes.queue, mosquitto.port, run, seconds,
                                                                      rate))  # fmt: skip
    publisher.start()
    reports = dict((r[0], r[1:]) for r in (processes.queue.get(), processes.queue.get()))
    listener.join()
    publisher.join()
    count, started, finished = reports["published"]
    latencies, last = reports["listened"]
    return _figures(count / (finished - started), latencies, count, started, last)


async def _handshake(broker, run: str) -> bytes:
    """A subscription to every reading of `run`, as the TCP subscriber's handshake."""
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub = (await client.subscribe([{"key": "run", "val": run, "op": "eq"}]))["subscriptionId"]
    return orjson.dumps({"authHash": "bench", "subscriptionId": sub})


async def veil_over_rest(broker, rate: float, seconds: float) -> dict:
    run = os.urandom(8).hex()
    handshake = await _handshake(broker, run)
    processes = Processes()
    processes.subscribers(broker.tcp_port, [handshake], seconds + 30, idle=5.0, every_line=True)
    await asyncio.sleep(1.0)
    processes.publisher(broker.url, run, seconds, rate or None)
    published, listened = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    return _figures(published.acked / (published.finished - published.started), listened.latencies,
                    published.acked, published.started, listened.last)  # fmt: skip


async def mqtt_to_veil(broker, mosquitto: MosquittoServer, rate: float, seconds: float, directory: str) -> dict:
    run = os.urandom(8).hex()
    handshake = await _handshake(broker, run)
    bridge = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "bridge", "mqtt", "--url", broker.url, "--auth-hash", "bench-bridge",
         "--mqtt", mosquitto.url, "--client-id", f"bench-bridge-{run[:8]}", "--topic", "readings/{site}",
         "--journal", os.path.join(directory, f"{run}.journal"), "--log-level", "warning"],
        stderr=open(os.path.join(directory, "bridge.log"), "ab"),  # noqa: SIM115  # the child's
    )  # fmt: skip
    try:
        processes = Processes()
        processes.subscribers(broker.tcp_port, [handshake], seconds + 40, idle=5.0, every_line=True)
        await asyncio.sleep(2.0)  # the bridge connected and subscribed
        cpu_before = cpu_seconds(bridge.pid)
        publisher = processes.context.Process(target=_mqtt_publish, args=(processes.queue, mosquitto.port, run,
                                                                          seconds, rate))  # fmt: skip
        publisher.start()
        processes.processes.append(publisher)
        reports = processes.results()
        cpu = cpu_seconds(bridge.pid) - cpu_before
    finally:
        bridge.terminate()
        bridge.wait(30)
    published = next(r for r in reports if isinstance(r, tuple))
    listened = next(r for r in reports if not isinstance(r, tuple))
    count, started, finished = published[1:]
    return _figures(count / (finished - started), listened.latencies, count, started, listened.last,
                    cpu / max(1, count) * 1e6)  # fmt: skip


def print_report(rows: list[tuple[float, dict[str, dict]]], seconds: float) -> None:
    cores = os.cpu_count()
    print(f"\nMQTT → Veil → subscriber, one subscription taking every reading; {cores} cores, {seconds:.0f} s a run")
    header = ["offered", "path", "held/s", "through/s", "p50 ms", "p99 ms", "delivered", "bridge µs/msg"]
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (9, 16, 8, 10, 8, 8, 15, 14), strict=True)))
    for rate, paths in rows:
        for name, f in paths.items():
            cpu = f"{f['cpu_us']:.0f}" if f["cpu_us"] is not None else "-"
            offered = f"{rate:.0f}" if rate else "max"
            print(f"{offered:>9} {name:>16} {f['held']:>8.0f} {f['through']:>10.0f} {f['p50']:>8.1f} {f['p99']:>8.1f} "
                  f"{f['delivered']:>7}/{f['expected']:<7} {cpu:>14}")  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    mosquitto = MosquittoServer().start()
    directory = tempfile.mkdtemp(prefix="veil-bench-mqtt-")
    rows = []
    try:
        with benched_broker(*args.broker_args, keep=args.keep) as broker:
            await veil_over_rest(broker, 200, 2)  # warm-up: Python workers, caches
            for rate in args.rates:
                paths = {
                    "mosquitto alone": mosquitto_alone(mosquitto, rate, args.seconds),
                    "veil over REST": await veil_over_rest(broker, rate, args.seconds),
                    "mqtt → veil": await mqtt_to_veil(broker, mosquitto, rate, args.seconds, directory),
                }
                rows.append((rate, paths))
    finally:
        mosquitto.stop()
    print_report(rows, args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=lambda text: [float(x) for x in text.split(",")], default=[500, 1000, 2000, 0])
    parser.add_argument("--seconds", type=float, default=8.0)
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
