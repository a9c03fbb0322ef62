"""Load shedding at the front door: which kinds of lag refuse a publish."""

from __future__ import annotations

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
