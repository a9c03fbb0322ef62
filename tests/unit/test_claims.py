"""Claims of subscriptions gathered into one write (`veil.gateway.claims`), on a real store of each dialect."""

import asyncio
import time

import pytest

from veil.gateway.claims import Claims
from veil.gateway.store_threads import StoreThreads

STALE = 10.0


@pytest.fixture
def threads(store):
    """The store's writing thread, as the gateway has it (the store itself is the fixture's to close)."""
    threads = StoreThreads(store)
    yield threads
    threads._writer.shutdown(wait=True)


def _subscriptions(store, count: int) -> list[tuple[str, int]]:
    for i in range(count):
        store.put_subscription(f"s{i}", "o", b"[]")
    return [(f"s{i}", store.subscription_number(f"s{i}")) for i in range(count)]


def _counted(store) -> list[int]:
    """The number of subscriptions each claim write carried, in order."""
    writes: list[int] = []
    claim = store.claim_subscriptions

    def counting(sub_ids, *args):
        writes.append(len(sub_ids))
        return claim(sub_ids, *args)

    store.claim_subscriptions = counting
    return writes


async def test_claims_asked_for_while_one_is_made_go_to_the_store_together(store, threads):
    store.take_over_gateway("A", "a1", 0)
    store.take_over_gateway("B", "b1", 0)
    subs = _subscriptions(store, 60)
    writes = _counted(store)
    claims = Claims()
    answers = await asyncio.gather(*(claims.claim(threads, [s], [n], "A", STALE) for s, n in subs))
    assert all(held is None for _, held in answers)
    assert sum(writes) == 60 and len(writes) < 60  # gathered, never more than asked
    now = time.time()  # all are A's: B is refused each of them
    for sub_id, number in subs:
        assert store.claim_subscriptions([sub_id], [number], "B", now, now - STALE) == (sub_id, "A")


async def test_a_subscription_held_elsewhere_refuses_only_the_connections_that_name_it(store, threads):
    """A hostile or stale client naming a subscription another gateway delivers to makes its own
    connection refused, never the connections gathered with it."""
    store.take_over_gateway("A", "a1", 0)
    store.take_over_gateway("B", "b1", 0)
    (s0, n0), (s1, n1), (s2, n2) = _subscriptions(store, 3)
    now = time.time()
    assert store.claim_subscriptions([s1], [n1], "B", now, now - STALE) is None
    writes = _counted(store)
    claims = Claims()
    first = asyncio.ensure_future(claims.claim(threads, [s0], [n0], "A", STALE))
    await asyncio.sleep(0)  # under way: the others are gathered into one write, which finds s2x removed
    answers = await asyncio.gather(
        claims.claim(threads, [s1, s2], [n1, n2], "A", STALE),
        claims.claim(threads, [s2 + "x"], [0], "A", STALE),  # nobody's id
        claims.claim(threads, [s2], [n2], "A", STALE),
    )
    assert (await first)[1] is None
    assert [held for _, held in answers] == [(s1, "B"), (s2 + "x", None), None]
    # s0; s1 s2 s2x (s2x removed: refused); s1 s2 (s1 held: refused); s2 again, asked for twice
    assert writes == [1, 3, 2, 1]
    now = time.time()
    assert store.claim_subscriptions([s2], [n2], "B", now, now - STALE) == (s2, "A")
    assert store.claim_subscriptions([s1], [n1], "C", now, now - STALE) == (s1, "B")  # B's, untouched


async def test_an_id_asked_for_twice_is_claimed_twice_and_a_gone_connections_claim_is_released_later(store, threads):
    store.take_over_gateway("A", "a1", 0)
    (s0, n0), (s1, n1) = _subscriptions(store, 2)
    writes = _counted(store)
    counting, loop = store.claim_subscriptions, asyncio.get_running_loop()
    tasks: dict[str, asyncio.Future] = {}

    def closing_meanwhile(sub_ids, *args):
        if len(sub_ids) == 2:  # its connection closes while its claim is being made
            loop.call_soon_threadsafe(tasks["gone"].cancel)
        return counting(sub_ids, *args)

    store.claim_subscriptions = closing_meanwhile
    claims = Claims()
    first = asyncio.ensure_future(claims.claim(threads, [s1], [n1], "A", STALE))
    await asyncio.sleep(0)  # under way: the rest wait, and are gathered
    old = asyncio.ensure_future(claims.claim(threads, [s0], [n0], "A", STALE))
    tasks["gone"] = asyncio.ensure_future(claims.claim(threads, [s1], [n1], "A", STALE))
    new = asyncio.ensure_future(claims.claim(threads, [s0], [n0], "A", STALE))
    (at_old, held_old), (at_new, held_new), _ = await asyncio.gather(old, new, first)
    assert held_old is None and held_new is None and at_old != at_new  # each release ends its own claim
    assert writes == [1, 2, 1]  # s1; s0 and s1 again; s0 again
    assert tasks["gone"].cancelled()
    assert [sub_ids for sub_ids, _ in claims.unreleased] == [[s1]]  # released with the next renewal


async def test_a_claim_made_for_a_connection_that_went_before_it_took_it_is_released_later(store, threads):
    store.take_over_gateway("A", "a1", 0)
    ((s0, n0),) = _subscriptions(store, 1)
    claims = Claims()
    answer = claims._answer

    def answered_then_gone(asked, at, held):
        answer(asked, at, held)
        task.cancel()  # the connection closes between the answer and its reading it

    claims._answer = answered_then_gone
    task = asyncio.ensure_future(claims.claim(threads, [s0], [n0], "A", STALE))
    while not task.done():
        await asyncio.sleep(0.01)
    assert task.cancelled()
    assert [sub_ids for sub_ids, _ in claims.unreleased] == [[s0]]
