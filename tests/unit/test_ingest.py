"""Load shedding at the front door: which kinds of lag refuse a publish."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit.helpers import published
from veil.gateway.delivery import Clients
from veil.gateway.ingest import Ingest, Overloaded
from veil.gateway.store_threads import StoreThreads
from veil.store import open_store


@pytest.fixture
def threads(tmp_path):
    threads = StoreThreads(open_store(f"sqlite:///{tmp_path}/veil.db"))
    yield threads
    threads.close()


async def test_most_clients_behind_refuses_publishes(threads):
    ingest = Ingest(threads, max_pending=100, max_lag=100, clients_behind=lambda: Clients(5, 8, 0))
    with pytest.raises(Overloaded, match="5 of 8 connected clients"):
        await ingest.append(published(b"{}"))


async def test_a_few_slow_subscribers_do_not(threads):
    for behind in (Clients(4, 8, 0), Clients(3, 3, 40)):  # half of them, or too few reading to judge
        ingest = Ingest(threads, max_pending=100, max_lag=100, clients_behind=lambda behind=behind: behind)
        assert len(await ingest.append(published(b"{}"))) == 1


async def test_a_flood_of_publishes_is_answered_in_groups_and_lets_other_writes_through(threads, monkeypatch):
    """The writing thread commits group after group while publishes keep coming; every publish gets
    its own offsets, what waits counts down to nothing, and a write of another kind queued in the
    middle of the flood is let through after the commit under way, not after the flood."""
    store = threads.store
    append = store.append_publications

    def append_slowly(*args):  # (each commit long enough for more publishes to come meanwhile)
        time.sleep(0.05)
        return append(*args)

    monkeypatch.setattr(store, "append_publications", append_slowly)
    ingest = Ingest(threads, max_pending=10_000, max_lag=10_000)
    ran: list[float] = []

    def other_write() -> None:
        ran.append(time.monotonic())
        store.put_subscription("other", "a", b"[]")

    flood = []
    for n in range(150):  # one publish every 5 ms, each waiting for its answer alone
        flood.append(asyncio.create_task(ingest.append(published(b"{}"))))
        await asyncio.sleep(0.005)
        if n == 40:
            asked = time.monotonic()
            other = asyncio.create_task(threads.write(other_write))
    await other
    answered = [offset for offsets in await asyncio.gather(*flood) for offset in offsets]
    assert len(answered) == len(set(answered)) == 150
    assert ingest._pending == 0
    assert ran[0] - asked < 0.11  # behind the commit under way, not the flood
