"""Per-client quotas: connections and queued bytes per identity, and who counts as behind."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_delivery import running_hub
from veil.gateway.bundle import Admitted, Bundle
from veil.gateway.quotas import STALLED_WRITE, Quotas, WriteWatch, fitting
from veil.protocol import Handshake, ProtocolError


def test_a_client_past_its_connections_is_refused_by_name_and_others_are_not():
    quotas = Quotas(max_connections=2, max_client_queued=100, max_queued=1000)
    held = [quotas.connect("bob"), quotas.connect("bob")]
    with pytest.raises(ProtocolError) as refused:
        quotas.connect("bob")
    assert (refused.value.status, refused.value.field) == (429, "handshake")
    assert "--max-client-connections" in refused.value.problem
    quotas.connect("alice")  # the limit is bob's alone
    quotas.disconnect(held.pop())
    quotas.connect("bob")  # room again
    webhooks = [quotas.connect("carol", webhook=True) for _ in range(5)]  # deliveries of webhook subscriptions
    quotas.connect("carol"), quotas.connect("carol")  # take none of carol's connections
    assert webhooks[0] is quotas.connect("carol", webhook=True)  # (one place, its queued bytes shared)


def test_queued_bytes_count_per_client_and_for_the_gateway():
    quotas = Quotas(max_connections=10, max_client_queued=100, max_queued=150)
    bob, alice = quotas.connect("bob"), quotas.connect("alice")
    quotas.take(bob, 90)
    assert (quotas.room(bob), quotas.room(alice)) == (10, 60)  # bob's own cap, then what the gateway has left
    quotas.take(alice, 60)
    assert (quotas.room(bob), quotas.room(alice)) == (0, 0)
    quotas.release(bob, 90)
    assert (quotas.room(bob), quotas.room(alice)) == (90, 40)


@given(st.lists(st.integers(1, 1000), max_size=30), st.integers(-10, 20_000), st.integers(0, 1))
def test_fitting_takes_the_longest_prefix_within_the_room_and_at_least_the_least(sizes, room, least):
    taken = fitting(np.array(sizes, np.int64), room, least)
    within = [n for n in range(len(sizes) + 1) if sum(sizes[:n]) <= room]
    assert taken == max([*within, min(least, len(sizes))])


async def test_one_client_with_many_subscriptions_behind_is_one_client_behind(tmp_path):
    async with running_hub(tmp_path) as hub:

        async def nothing(_: object) -> None:
            pass

        def session(number: int, identity: str, caught_up: bool) -> Bundle:
            client = hub.quotas.connect(identity)
            handshake = Handshake("a", f"s{number}", False, False, None)
            made = Bundle(hub, handshake, [Admitted(f"s{number}", number, 0, 0.0)], nothing, nothing, client)
            made.live[:] = caught_up
            return made

        for number in range(16):
            hub.attach(session(number, "bob", caught_up=False))
        for number in range(16, 23):
            hub.attach(session(number, f"reader-{number}", caught_up=True))
        assert hub.behind() == 16 and hub.clients_behind() == (1, 8, 0)
        hub.attach(session(23, "reader-16", caught_up=False))  # one of its two behind: not most
        assert hub.clients_behind() == (1, 8, 0)
        silent = session(24, "silent", caught_up=False)
        silent.watch.slow = True  # its last write waited for it: between writes it still does not count
        hub.attach(silent)
        assert hub.clients_behind() == (1, 8, 1)  # counted apart
        reading = session(25, "reader-16", caught_up=True)
        reading.watch.slow = True  # a client with another connection that reads is not counted apart
        hub.attach(reading)
        assert hub.clients_behind() == (1, 8, 1)


async def test_a_client_stays_not_reading_from_a_write_that_waited_until_one_goes_through_at_once():
    watch = WriteWatch()
    with watch.writing():
        assert not watch.not_reading(time.monotonic())
        await asyncio.sleep(STALLED_WRITE * 1.2)
        assert watch.not_reading(time.monotonic())
    assert watch.not_reading(time.monotonic())  # between writes too, e.g. while its backlog is read
    with watch.writing():
        pass
    assert not watch.not_reading(time.monotonic())
