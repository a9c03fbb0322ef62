"""Delivery connections in-process: handshakes refused with the reason, and an edge broker's channel
(which needs the log, not the pipeline)."""

import asyncio
import base64
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import orjson
import pytest
from aiohttp import web

from tests.gateway.conftest import ALICE, BOB
from veil.gateway import bundle as bundle_module
from veil.gateway import channel as channel_module
from veil.gateway import membership
from veil.gateway.bundle import Admitted, Bundle
from veil.gateway.quotas import Client
from veil.gateway.tcp import start_tcp
from veil.gateway.websocket import create_ws_app
from veil.matching.stored import encode_subscription
from veil.protocol import Handshake
from veil.store import Publication, Round, StoreUnavailable

Until = Callable[[Callable[[], bool]], Awaitable[None]]
pytestmark = pytest.mark.asyncio(loop_scope="module")  # the loop the fixtures run on
BOX = [["lat", "ge", 1.0]]


@pytest.fixture
async def tcp(gateway):
    server = await start_tcp(gateway, "127.0.0.1", 0, None)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def exchange(port: int, handshake: dict, lines: int = 1) -> list[dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(orjson.dumps(handshake) + b"\n")
    try:
        return [orjson.loads(await asyncio.wait_for(reader.readline(), 5)) for _ in range(lines)]
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def attached(gateway, port: int, sub_id: str, auth: str) -> AsyncIterator[asyncio.StreamReader]:
    """A delivery connection of `sub_id`, open (its reader) once the hub holds it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(orjson.dumps({"subscriptionId": sub_id, "authHash": auth}) + b"\n")
    try:
        async with asyncio.timeout(5):
            while sub_id not in gateway.hub.holders:
                await asyncio.sleep(0.01)
        yield reader
    finally:
        writer.close()


async def test_handshakes_are_refused_with_the_reason(gateway, tcp):
    await gateway.threads.write(gateway.threads.store.put_subscription, "s", "alice", encode_subscription([]))
    unknown = await exchange(tcp, {"subscriptionId": "nobody", "authHash": ALICE})
    other = await exchange(tcp, {"subscriptionId": "s", "authHash": BOB})
    # one answer for an id nobody holds and for one someone else holds
    assert unknown == other and (unknown[0]["status"], unknown[0]["field"]) == (404, "subscriptionId")
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp)
    writer.write(b"{not json\n")
    refused = orjson.loads(await asyncio.wait_for(reader.readline(), 5))
    assert refused["status"] == 400 and await reader.read() == b""  # and closed


async def test_an_edge_channel_gets_the_subscriptions_it_could_serve_then_synced(gateway, tcp):
    store = gateway.threads.store
    store.put_subscription("near", "alice", encode_subscription([["lat", "le", 5.0]]))
    store.put_subscription("far", "alice", encode_subscription([["lat", "le", 0.5]]))
    store.put_announcement("edge", "bob", orjson.dumps(BOX))
    wanted, synced = await exchange(tcp, {"announcementId": "edge", "authHash": BOB}, lines=2)
    assert wanted == {"subscribe": f"s{store.subscription_number('near')}", "data": [["lat", "le", 5.0]]}
    assert synced == {"synced": store.head_offset()}


async def test_a_multiplexed_connection_writes_each_publication_once_with_its_subscriptions(gateway, tcp):
    store = gateway.threads.store
    for sub_id in ("m1", "m2", "m3"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    number = {sub_id: store.subscription_number(sub_id) for sub_id in ("m1", "m2", "m3")}
    refused = await exchange(tcp, {"subscriptionIds": ["m1", "nobody"], "authHash": ALICE})
    assert refused[0]["field"] == "subscriptionIds" and refused[0]["status"] == 404 and "nobody" in refused[0]["error"]
    polling = asyncio.create_task(gateway.hub.poll())
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp)
    writer.write(orjson.dumps({"subscriptionIds": ["m1", "m2", "m3"], "authHash": ALICE}) + b"\n")
    try:
        while len(gateway.hub.holders) < 3:
            await asyncio.sleep(0.01)
        first, second = store.append_publications([Publication(b'{"n":1}', "bob"), Publication(b'{"n":2}', "bob")])
        # first to m1 and m3, second to m2 only; the feed lists matches by subscription
        pairs = sorted([(number["m1"], first), (number["m3"], first), (number["m2"], second)])
        store.record_round(Round(np.array([s for s, _ in pairs]), np.array([p for _, p in pairs]), second))
        lines = [orjson.loads(await asyncio.wait_for(reader.readline(), 5)) for _ in range(2)]
        assert [(line["seq"], sorted(line["subscriptionIds"]), line["publication"]) for line in lines] == [
            (first, ["m1", "m3"], {"n": 1}),
            (second, ["m2"], {"n": 2}),
        ]
        writer.write(orjson.dumps({"ack": second}) + b"\n")  # covers all three
        gateway.hub.kick("m2", b'{"error":"unsubscribed","field":"subscriptionId","status":404}')
        ended = orjson.loads(await asyncio.wait_for(reader.readline(), 5))
        assert ended["subscriptionId"] == "m2" and set(gateway.hub.holders) == {"m1", "m3"}
        await gateway.hub.flush_cursors()
        assert [store.cursor(s) for s in ("m1", "m3")] == [first, first]
    finally:
        writer.close()
        polling.cancel()


@contextlib.asynccontextmanager
async def bundle_running(gateway, sub_ids: list[str], frames: list[dict]) -> AsyncIterator[tuple[Bundle, Until]]:
    """A multiplexed connection's bundle, attached to the hub and pushing, whose writes land in
    `frames`; and a wait (5 s at most) for a condition, failing at once with the error of the
    bundle's or the hub's loop if either ended."""
    store = gateway.threads.store

    async def send(lines: list[bytes]) -> None:
        frames.extend(map(orjson.loads, lines))

    async def close(error: bytes | None) -> None:
        pass

    admitted = [Admitted(sub_id, store.subscription_number(sub_id), 0, 0.0) for sub_id in sub_ids]
    handshake = Handshake(ALICE, "", envelope=True, ack=True, resume_after=None, subscription_ids=tuple(sub_ids))
    bundle = Bundle(gateway.hub, handshake, admitted, send, close, Client(""))
    gateway.hub.attach(bundle)
    loops = (asyncio.create_task(bundle.run()), asyncio.create_task(gateway.hub.poll()))

    async def until(condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not condition():
                for loop in loops:
                    if loop.done():
                        loop.result()
                await asyncio.sleep(0.01)

    try:
        yield bundle, until
    finally:
        for loop in loops:
            loop.cancel()
        gateway.hub.detach(bundle)


def delivered(frames: list[dict], sub_id: str) -> list[int]:
    return [frame["seq"] for frame in frames if sub_id in frame["subscriptionIds"]]


async def test_a_bundle_that_would_overflow_reads_from_the_store_and_keeps_each_subscriptions_order(
    gateway, monkeypatch
):
    store = gateway.threads.store
    for sub_id in ("o1", "o2"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    numbers = np.array([store.subscription_number(s) for s in ("o1", "o2")])

    def publish(count: int) -> list[int]:
        pubs = store.append_publications([Publication(b'{"n":%d}' % n, "bob") for n in range(count)])
        store.record_round(Round(np.repeat(numbers, count), np.tile(pubs, 2), max(pubs)))
        return pubs

    monkeypatch.setattr(bundle_module, "LINE_LIMIT", 2)
    backlog = publish(5)  # queued before the connection: read from the store
    frames: list[dict] = []
    async with bundle_running(gateway, ["o1", "o2"], frames) as (bundle, until):
        await until(lambda: not bundle.standing()[0])
        live = publish(3)  # three lines for a queue of two: both subscriptions go back to the store
        await until(lambda: len(delivered(frames, "o2")) >= len(backlog) + len(live))
        assert delivered(frames, "o1") == delivered(frames, "o2") == backlog + live


async def test_an_acknowledgement_covers_the_lines_written_before_the_one_it_names(gateway):
    store = gateway.threads.store
    for sub_id in ("a1", "a2"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    one, two = (store.subscription_number(s) for s in ("a1", "a2"))
    old = store.append_publications([Publication(b'{"old":1}', "bob")])[0]
    store.record_round(Round(np.array([one]), np.array([old]), old))  # a1's backlog
    frames: list[dict] = []
    async with bundle_running(gateway, ["a1", "a2"], frames) as (bundle, until):
        await until(lambda: not bundle.standing()[0])
        new = store.append_publications([Publication(b'{"new":1}', "bob")])[0]
        store.record_round(Round(np.array([one, two]), np.array([new, new]), new))
        await until(lambda: len(frames) >= 2)
        assert [(f["seq"], f["subscriptionIds"]) for f in frames] == [(old, ["a1"]), (new, ["a1", "a2"])]
        bundle.acknowledge(old)  # the first line only
        assert bundle.cursor_changes() == {one: old}
        bundle.acknowledge(new)
        assert bundle.cursor_changes() == {one: new, two: new}
        bundle.acknowledge(12345)  # never written: nothing moves
        assert bundle.cursor_changes() == {}


async def test_lines_never_acknowledged_are_folded_and_the_next_acknowledgement_covers_them(gateway, monkeypatch):
    monkeypatch.setattr(bundle_module, "UNACKED_DELIVERIES", 1)  # one delivery remembered line by line
    store = gateway.threads.store
    for sub_id in ("f1", "f2"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    number = {s: store.subscription_number(s) for s in ("f1", "f2")}
    frames: list[dict] = []
    async with bundle_running(gateway, ["f1", "f2"], frames) as (bundle, until):
        await until(lambda: not bundle.standing()[0])
        pubs: list[int] = []
        for written, sub_id in enumerate(("f1", "f2", "f1"), 1):  # one write each
            pubs += store.append_publications([Publication(b"{}", "bob")])
            store.record_round(Round(np.array([number[sub_id]]), np.array(pubs[-1:]), pubs[-1]))
            await until(lambda written=written: len(frames) == written)
        bundle.acknowledge(pubs[0])  # forgotten: it cannot be placed
        assert bundle.cursor_changes() == {}
        bundle.acknowledge(pubs[2])  # covers the forgotten lines too
        assert bundle.cursor_changes() == {number["f1"]: pubs[2], number["f2"]: pubs[1]}


@pytest.mark.parametrize("handshake", [{"subscriptionId": "f1"}, {"subscriptionIds": ["f1", "f2"]}])
@pytest.mark.parametrize("failing", ["live_numbers", "backlogs"])
async def test_a_connection_that_a_store_error_ends_gives_back_its_claims_and_its_connection(
    gateway, tcp, monkeypatch, handshake, failing
):
    """A store error after the claim (the re-check that follows the attach, or the first backlog
    read once serving) ends the connection; it must not leave its subscriptions claimed by this
    gateway (refused on any other), its bytes or its place in its client's connections counted."""
    store = gateway.threads.store
    for sub_id in ("f1", "f2"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    numbers = [store.subscription_number("f1"), store.subscription_number("f2")]

    def fail(*args: object) -> None:
        raise StoreUnavailable("the store went away")

    monkeypatch.setattr(store, failing, fail)
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp)
    writer.write(orjson.dumps({**handshake, "authHash": ALICE}) + b"\n")
    try:
        async with asyncio.timeout(5):
            lines = (await reader.read()).splitlines()
    finally:
        writer.close()
    assert orjson.loads(lines[-1])["status"] == 503  # told to come back, not just cut off
    async with asyncio.timeout(5):
        while gateway.hub.quotas._clients or gateway.hub.holders or gateway.hub.quotas.queued:
            await asyncio.sleep(0.01)
    now = time.time()
    store.renew_gateway(gateway.config.gateway_name, gateway.incarnation, 0)  # this gateway is alive: a claim of it would hold
    assert store.claim_subscriptions(["f1", "f2"], numbers, "elsewhere", now, now - 10) is None


async def test_a_connection_refused_at_the_clients_limit_leaves_the_older_ones_claim(gateway, tcp, monkeypatch):
    store = gateway.threads.store
    store.put_subscription("c1", "alice", encode_subscription([]))
    monkeypatch.setattr(gateway.hub.quotas, "max_connections", 1)
    async with attached(gateway, tcp, "c1", ALICE):
        refused = await exchange(tcp, {"subscriptionId": "c1", "authHash": ALICE})
        assert refused[0]["status"] == 429
        now = time.time()
        store.renew_gateway(gateway.config.gateway_name, gateway.incarnation, 0)
        held = store.claim_subscriptions(["c1"], [store.subscription_number("c1")], "elsewhere", now, now - 10)
        assert held == ("c1", gateway.config.gateway_name)  # the older connection still holds it


async def test_a_release_the_store_refused_is_made_with_the_next_renewal(gateway, monkeypatch):
    store = gateway.threads.store
    store.put_subscription("r1", "alice", encode_subscription([]))
    number = store.subscription_number("r1")
    claimed = await membership.claim(gateway, ["r1"], [number])
    real = store.release_subscriptions

    def fail(*args: object) -> None:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(store, "release_subscriptions", fail)
    await membership.release(gateway, ["r1"], claimed)
    assert gateway.unreleased == [(["r1"], claimed)]
    monkeypatch.setattr(store, "release_subscriptions", real)
    monkeypatch.setattr(membership, "RENEW", 0.01)
    renewing = asyncio.create_task(membership.stay_alive(gateway))
    try:
        async with asyncio.timeout(5):
            while gateway.unreleased:
                await asyncio.sleep(0.01)
    finally:
        renewing.cancel()
    now = time.time()
    assert store.claim_subscriptions(["r1"], [number], "elsewhere", now, now - 10) is None


async def test_a_stale_connection_never_displaces_a_newer_subscription_of_its_id(gateway, tcp):
    """Alice's connection was admitted for her subscription "x" just before she removed it and bob
    took the id and connected: her late attach must neither end bob's connection nor take his place."""
    store = gateway.threads.store
    store.put_subscription("x", "alice", encode_subscription([]))
    store.put_subscription("y", "alice", encode_subscription([]))
    stale = [
        Admitted("x", store.subscription_number("x"), 0, 0.0),
        Admitted("y", store.subscription_number("y"), 0, 0.0),
    ]
    store.remove_subscription("x", "alice")
    store.put_subscription("x", "bob", encode_subscription([]))
    async with attached(gateway, tcp, "x", BOB) as reader:
        bobs = gateway.hub.holders["x"]
        handshake = Handshake(ALICE, "", envelope=True, ack=True, resume_after=None, subscription_ids=("x", "y"))

        async def ignore(*args: object) -> None:
            pass

        bundle = Bundle(gateway.hub, handshake, stale, ignore, ignore, Client(""))
        gateway.hub.attach(bundle)
        assert gateway.hub.holders["x"] is bobs and gateway.hub.holders["y"] is bundle
        gateway.hub.detach(bundle)
        assert gateway.hub.holders == {"x": bobs}
        with pytest.raises(TimeoutError):  # bob was told nothing: his connection goes on
            await asyncio.wait_for(reader.readline(), 0.3)


async def test_a_gateway_starting_under_a_running_ones_id_is_refused(gateway, monkeypatch):
    """Each would drop the other's claims: the second is refused while the first renews its row, and
    the first keeps its row and claims."""
    store, name = gateway.threads.store, gateway.config.gateway_name
    monkeypatch.setattr(membership, "WATCH", 0.05)
    number, now = claimed_by_namesake(gateway, "running"), time.time()
    renewing = asyncio.create_task(renew_every(store, name, "running", 0.02))
    try:
        with pytest.raises(ValueError, match=f"--gateway-id {name}: a gateway of that name is running"):
            await membership.start(gateway)
    finally:
        renewing.cancel()
    assert store.gateway_row(name)[1] == "running"
    assert store.claim_subscriptions(["running"], [number], "elsewhere", now, now - 10) == ("running", name)


async def test_a_gateway_restarted_after_a_crash_takes_its_id_once_the_crashed_ones_row_stays_still(
    gateway, monkeypatch
):
    """Watched by the starting gateway's own clock, whatever the row's time says."""
    store, name = gateway.threads.store, gateway.config.gateway_name
    monkeypatch.setattr(membership, "WATCH", 0.05)
    monkeypatch.setattr(membership, "WATCH_FOR", 0.5)
    number = claimed_by_namesake(gateway, "crashed")
    started = time.monotonic()
    await membership.start(gateway)
    assert 0.4 < time.monotonic() - started < 3
    now = time.time()
    assert store.claim_subscriptions(["crashed"], [number], "elsewhere", now, now - 10) is None  # dropped
    assert store.gateway_row(name)[1] == gateway.incarnation


async def test_a_gateway_whose_id_another_took_over_stops(gateway, monkeypatch):
    """Two started at once, or this one silent too long: the one that finds its name taken stops, and
    its leaving drops nothing of the other's."""
    store, name = gateway.threads.store, gateway.config.gateway_name
    monkeypatch.setattr(membership, "RENEW", 0.01)
    number, now = claimed_by_namesake(gateway, "other"), time.time()
    async with asyncio.timeout(5):
        await membership.stay_alive(gateway)
    assert gateway.replaced.is_set() and gateway.stop.is_set()
    await membership.leave(gateway)
    assert store.gateway_row(name)[1] == "other"
    assert store.claim_subscriptions(["other"], [number], "elsewhere", now, now - 10) == ("other", name)


def claimed_by_namesake(gateway, incarnation: str) -> int:
    """Another process of this gateway's name holds it, and a claim of its subscription `incarnation`
    (alice's); that subscription's number."""
    store, name = gateway.threads.store, gateway.config.gateway_name
    store.put_subscription(incarnation, "alice", encode_subscription([]))
    number, now = store.subscription_number(incarnation), time.time()
    store.take_over_gateway(name, incarnation, 0)
    assert store.claim_subscriptions([incarnation], [number], name, now, now - 10) is None
    return number


async def renew_every(store, name: str, incarnation: str, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        store.renew_gateway(name, incarnation, 0)


async def test_a_multiplexed_connection_replaced_whole_is_told_each_id_in_one_write(gateway, tcp, monkeypatch):
    """Its ids end together: one background task and one write of every id's line, not one each."""
    store = gateway.threads.store
    endings: list[int] = []
    end = Bundle.end

    async def counted(bundle: Bundle, ended: list) -> None:
        endings.append(len(ended))
        await end(bundle, ended)

    monkeypatch.setattr(Bundle, "end", counted)
    ids = [f"whole{i}" for i in range(50)]
    for sub_id in ids:
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    first_reader, first = await asyncio.open_connection("127.0.0.1", tcp)
    first.write(orjson.dumps({"subscriptionIds": ids, "authHash": ALICE}) + b"\n")
    async with asyncio.timeout(5):
        while any(sub_id not in gateway.hub.holders for sub_id in ids):
            await asyncio.sleep(0.01)
    older = gateway.hub.holders[ids[0]]
    _, second = await asyncio.open_connection("127.0.0.1", tcp)
    second.write(orjson.dumps({"subscriptionIds": ids, "authHash": ALICE}) + b"\n")
    try:
        async with asyncio.timeout(5):
            while gateway.hub.holders[ids[0]] is older:
                await asyncio.sleep(0.01)
            ended = [orjson.loads(line) for line in (await first_reader.read()).splitlines()]
        assert endings == [len(ids)]
        assert sorted(line["subscriptionId"] for line in ended) == sorted(ids)
        assert {(line["status"], line["error"]) for line in ended} == {(409, "replaced by a newer connection")}
    finally:
        first.close()
        second.close()


async def test_a_client_that_half_closes_and_never_reads_is_cut_off(gateway, tcp, monkeypatch):
    """The gateway would otherwise keep its socket, and what waits to be written to it, for as long
    as the client reads nothing."""
    monkeypatch.setattr(channel_module, "CLOSE_WAIT", 0.2)
    writer = await flooded(gateway, "half", tcp, {"subscriptionId": "half", "authHash": ALICE})
    try:
        writer.write_eof()
        await until_cut_off(gateway, tcp)
    finally:
        writer.close()


@pytest.mark.parametrize("ids", [["kicked"], ["kicked", "kicked2"]])
async def test_a_connection_the_gateway_ends_is_cut_off_when_its_client_reads_nothing(gateway, tcp, monkeypatch, ids):
    """Its unsubscribed client's push waits for it: the connection, its socket and its place in its
    client's connections would stay as long as it reads nothing."""
    monkeypatch.setattr(channel_module, "CLOSE_WAIT", 0.2)
    handshake = {"subscriptionIds": ids} if len(ids) > 1 else {"subscriptionId": ids[0]}
    writer = await flooded(gateway, ids, tcp, {**handshake, "authHash": ALICE})
    try:
        for sub_id in ids:
            gateway.hub.kick(sub_id, b'{"error":"unsubscribed","field":"subscriptionId","status":410}')
        await until_cut_off(gateway, tcp)
    finally:
        writer.close()


async def test_a_websocket_client_that_closes_and_never_reads_is_cut_off(gateway, monkeypatch):
    """aiohttp answers a client's close and closes its transport, which waits for the client to read
    what was written: the socket would stay, though the connection gave back its place."""
    monkeypatch.setattr(channel_module, "CLOSE_WAIT", 0.2)
    runner = web.AppRunner(create_ws_app(gateway), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = (
        f"GET / HTTP/1.1\r\nHost: veil\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    handshake = orjson.dumps({"subscriptionId": "wsclose", "authHash": ALICE})
    writer = await flooded(gateway, "wsclose", port, upgrade.encode() + ws_frame(0x1, handshake))
    try:
        writer.write(ws_frame(0x8, (1000).to_bytes(2, "big")))
        await until_cut_off(gateway, port)
    finally:
        writer.close()
        await runner.cleanup()


async def flooded(
    gateway, ids: str | list[str], port: int, handshake: dict | bytes
) -> asyncio.StreamWriter:
    """A connection of a client that reads nothing, once its subscriptions' backlog of 10 MB (more
    than the sockets hold) fills what waits to be written to it."""
    store = gateway.threads.store
    ids = [ids] if isinstance(ids, str) else ids
    for sub_id in ids:
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    pubs = store.append_publications([Publication(b'{"pad":"%s"}' % (b"x" * 100_000), "bob") for _ in range(100)])
    numbers = [store.subscription_number(sub_id) for sub_id in ids]
    store.record_round(Round(np.repeat(numbers, len(pubs)), np.tile(pubs, len(ids)), max(pubs)))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    _, writer = await asyncio.open_connection(sock=sock)
    writer.write(handshake if isinstance(handshake, bytes) else orjson.dumps(handshake) + b"\n")
    async with asyncio.timeout(5):
        while any(sub_id not in gateway.hub.holders for sub_id in ids):
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # what the client does not read piles up in the gateway's socket
    return writer


async def until_cut_off(gateway, port: int) -> None:
    """Until the gateway holds no socket on `port` (the client's stays open) and its client no place."""
    async with asyncio.timeout(5):
        while held_sockets(port) or gateway.hub.quotas._clients:
            await asyncio.sleep(0.02)


def held_sockets(port: int) -> int:
    """The gateway's sockets on `port` that it has not closed: established, or closed by the client only."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(int(row[1].split(":")[1], 16) == port and row[3] in ("01", "08") for row in rows)


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One final WebSocket frame from a client (masked, as clients' frames are)."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return bytes([0x80 | opcode]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
