"""The SELIS monitoring channel (seed 000 §6.1, SPEC §8): a client whose handshake carries the
authHash in `--metrics-auth-hash-file` gets, every `--metrics-interval` seconds, the broker's state
summary, its operations summary (totals kept in the store, so they survive restarts) and the rates
over the last interval, on the WebSocket or the TCP delivery port.

    {"timestamp": 1764000000000,
     "state": {"subscribers": 3, "subscriptions": 5, "connections": 4, "queued": 0},
     "operations": {"received": 1200, "matched": 310, "forwarded": 930},
     "performance": {"receiveRate": 40.0, "matchRate": 10.3, "forwardRate": 31.0}}

`queued` is the deliveries matched and not yet sent (sends again after a reconnect count as sent,
so it is a lower bound).
"""

from __future__ import annotations

import asyncio
import hmac
import time

import orjson

from veil.gateway.channel import Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.monitoring.figures import StoreFigures
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.store import Totals


def read_hash(path: str | None) -> str | None:
    """The monitoring authHash: the file's first line (None: monitoring off)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        secret = handle.readline().strip()
    if not secret:
        raise ValueError(f"--metrics-auth-hash-file {path}: empty")
    return secret


async def totals(gateway: Gateway) -> Totals:
    """The store's totals, with the deliveries this gateway sent and has not yet counted there."""
    stored = await gateway.threads.read(gateway.threads.store.totals)
    return stored._replace(forwarded=stored.forwarded + gateway.hub.forwarded)


async def store_figures(gateway: Gateway) -> StoreFigures:
    """What /metrics reads from the store (at most once a second: `Metrics`)."""
    batches = await gateway.threads.read(gateway.threads.store.batch_durations)
    return StoreFigures(await totals(gateway), batches)


def is_monitor(gateway: Gateway, handshake: bytes | str) -> bool:
    """Whether a delivery handshake is the monitoring client's (compared in constant time)."""
    secret = gateway.metrics_hash
    if secret is None:
        return False
    try:  # read as every handshake is (duplicate keys refused), so that no reading differs from another
        doc = load_json(handshake, "handshake")
    except ProtocolError:
        return False
    claimed = doc.get("authHash") if isinstance(doc, dict) else None
    return isinstance(claimed, str) and hmac.compare_digest(claimed.encode(), secret.encode())


def message(gateway: Gateway, now: Totals, before: Totals, seconds: float) -> bytes:
    def rate(field: str) -> float:
        return round(max(0, getattr(now, field) - getattr(before, field)) / seconds, 3) if seconds > 0 else 0.0

    return orjson.dumps(
        {
            "timestamp": int(time.time() * 1000),
            "state": {
                "subscribers": now.subscribers,
                "subscriptions": now.subscriptions,
                "connections": gateway.health.connections,
                "queued": now.queued,
            },
            "operations": {"received": now.received, "matched": now.matched, "forwarded": now.forwarded},
            "performance": {
                "receiveRate": rate("received"),
                "matchRate": rate("matched"),
                "forwardRate": rate("forwarded"),
            },
        }
    )


async def serve(gateway: Gateway, send: Send, close: Close, receive: Receive) -> None:
    """One monitoring client until it leaves: a message at once, then one per interval."""

    async def report() -> None:
        before, then = await totals(gateway), time.monotonic()
        await send([message(gateway, before, before, 0)])
        while True:
            await asyncio.sleep(gateway.config.metrics_interval)
            now, at = await totals(gateway), time.monotonic()
            await send([message(gateway, now, before, at - then)])
            before, then = now, at

    reporter = asyncio.create_task(report())
    try:
        await read_while(reporter, receive, lambda _: None)
    finally:
        reporter.cancel()
        await close(None)
