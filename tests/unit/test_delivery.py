"""The delivery hub against a real store, without sockets: fan-out by subscription number."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.unit.helpers import published
from veil.gateway.delivery import DeliveryHub, Session
from veil.gateway.store_threads import StoreThreads
from veil.protocol import Handshake
from veil.store import Round, open_store

RUNNING: set[asyncio.Task] = set()


@contextlib.asynccontextmanager
async def running_hub(path) -> AsyncIterator[DeliveryHub]:
    """Built inside the test's own event loop, where its poller must run."""
    threads = StoreThreads(open_store(f"sqlite:///{path}/veil.db"))
    hub = DeliveryHub(threads, poll_interval=0.001)
    await hub.start()
    poller = asyncio.create_task(hub.poll())
    try:
        yield hub
    finally:
        await hub.stop()
        await poller
        threads.close()


async def connect(hub: DeliveryHub, number: int) -> list[bytes]:
    """A caught-up session (nothing queued for it in the store); returns what it was sent."""
    sent: list[bytes] = []

    async def send(frames: list[bytes]) -> None:
        sent.extend(frames)

    async def close(_: bytes | None) -> None:
        pass

    session = Session(hub, Handshake("a", f"s{number}", False, False, None), number, 0, send, close)
    session.caught_up = True
    await hub.attach(session)
    RUNNING.add(asyncio.create_task(session.run()))
    return sent


async def until(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_numbers_far_beyond_the_first_table_are_served(tmp_path):
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        first, second = store.append_publications(published(b'{"n":1}', b'{"n":2}'))
        far_sent = await connect(hub, 5000)
        near_sent = await connect(hub, 3)
        store.record_round(Round([4998, 3], [first, first], first))  # the table grows, short of 5000
        store.record_round(Round([5000, 3], [second, second], second))
        await until(lambda: len(far_sent) == 1 and len(near_sent) == 2)
        assert far_sent == [b'{"n":2}'] and near_sent == [b'{"n":1}', b'{"n":2}']
