"""The client's delivery streams against a scripted broker, hostile where the test says so: where a
reconnect resumes, what is acknowledged on the new connection, what is dropped as a repeat (and
counted), and lines the protocol does not allow, which never reach the application or stall it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import orjson
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from veil.client import Overloaded, VeilClient
from veil.client.client import DeliveryStream
from veil.client.sealed import ReplayWindow, ScopeKeyring, origin_of, seal_publication
from veil.security.sealing import ScopeKey

Script = Callable[[asyncio.StreamWriter], Awaitable[None]]
RECIPIENT = X25519PrivateKey.generate()


class ScriptedBroker:
    """A delivery port that plays one script per connection (the last one again for any later
    connection) and records every document the client sends on each."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = scripts
        self.sent: list[list[dict]] = []
        self.connected = asyncio.Condition()

    async def __aenter__(self) -> ScriptedBroker:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()

    def client(self) -> VeilClient:
        return VeilClient("http://127.0.0.1:1", auth_hash="h", tcp_port=self.port)

    async def connections(self, n: int) -> None:
        async with asyncio.timeout(20), self.connected:
            await self.connected.wait_for(lambda: len(self.sent) >= n)

    async def acks(self, connection: int) -> list[int]:
        """The acknowledgements of a connection, once it has some."""
        async with asyncio.timeout(20):
            while len(self.sent[connection]) < 2:
                await asyncio.sleep(0.02)
        return [doc["ack"] for doc in self.sent[connection][1:]]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got: list[dict] = [orjson.loads(await reader.readline())]
        async with self.connected:
            self.sent.append(got)
            self.connected.notify_all()
        script = self.scripts[min(len(self.sent), len(self.scripts)) - 1]
        reading = asyncio.create_task(_read(reader, got))
        try:
            await script(writer)
            await writer.drain()
            await asyncio.sleep(0.1)  # what the client sends back arrives before the close
        except asyncio.CancelledError:
            pass  # the test is over
        finally:
            writer.close()
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


async def _read(reader: asyncio.StreamReader, into: list[dict]) -> None:
    while line := await reader.readline():
        into.append(orjson.loads(line))


def line(seq: int, *ids: str) -> bytes:
    doc: dict = {"seq": seq, "id": f"p{seq}", "publication": {"n": seq}}
    if ids:
        doc["subscriptionIds"] = list(ids)
    return orjson.dumps(doc) + b"\n"


def lines(*docs: bytes, stay: bool = False) -> Script:
    """Write `docs`, then close, or `stay` connected."""

    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(docs))
        if stay:
            await asyncio.sleep(3600)

    return script


def after(event: asyncio.Event, *docs: bytes, then: tuple[bytes, ...] = ()) -> Script:
    """Write `docs`, wait for the test's event, write `then`, and close."""

    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(docs))
        await writer.drain()
        await event.wait()
        writer.write(b"".join(then))

    return script


def forever() -> Script:
    return lines(stay=True)


async def take(stream: DeliveryStream, n: int) -> list[tuple[int | None, tuple[str, ...]]]:
    async with asyncio.timeout(20):
        return [((d := await anext(stream)).seq, d.subscription_ids) for _ in range(n)]


async def test_a_reconnect_resumes_after_what_was_consumed_and_the_rest_comes_again():
    consumed = asyncio.Event()
    first = after(consumed, line(1), line(2), then=(line(3),))
    async with ScriptedBroker(first, lines(line(2), line(3), line(4)), forever()) as broker:
        client = broker.client()
        async with client.deliveries("s") as stream:
            assert await take(stream, 1) == [(1, ())]
            consumed.set()  # 2 and 3 reach the queue unconsumed; the connection breaks
            await broker.connections(2)
            assert [seq for seq, _ in await take(stream, 3)] == [2, 3, 4]
            assert stream.dropped_duplicates == 0
        assert broker.sent[1][0]["resumeAfter"] == 1
        assert not [ack for ack in broker.sent[1][1:] if ack["ack"] < 2]  # nothing of the first connection
        await client.close()


async def test_consumed_on_next_resumes_before_the_delivery_the_application_still_holds():
    dropped = asyncio.Event()
    first = after(dropped, line(1), line(2))
    async with ScriptedBroker(first, lines(line(2), line(3)), forever()) as broker:
        client = broker.client()
        async with client.deliveries("s", consumed_on_next=True) as stream:
            assert await take(stream, 2) == [(1, ()), (2, ())]  # 1 counts as consumed; 2 is still held
            dropped.set()  # the connection breaks while the application works on 2
            await broker.connections(2)
            assert [seq for seq, _ in await take(stream, 2)] == [2, 3]  # 2 again: it was never consumed
        assert broker.sent[1][0]["resumeAfter"] == 1
        await client.close()


async def test_a_broker_that_sends_again_what_was_consumed_is_caught():
    consumed = asyncio.Event()
    async with ScriptedBroker(after(consumed, line(1), line(2)), lines(line(2), line(1), line(3)), forever()) as broker:
        client = broker.client()
        async with client.deliveries("s") as stream:
            assert [seq for seq, _ in await take(stream, 2)] == [1, 2]
            consumed.set()
            assert [seq for seq, _ in await take(stream, 1)] == [3]
            assert stream.dropped_duplicates == 2  # 2 and 1, after resumeAfter 2
        await client.close()


async def test_a_multiplexed_reconnect_resumes_each_subscription_and_acknowledges_only_the_new_connection():
    consumed = asyncio.Event()
    first = after(consumed, line(3, "a", "b"), line(7, "a"), then=(line(9, "b"),))
    second = lines(line(9, "b"), line(11, "a", "b"), stay=True)
    async with ScriptedBroker(first, second) as broker:
        client = broker.client()
        async with client.multiplexed(["a", "b"]) as stream:
            assert await take(stream, 2) == [(3, ("a", "b")), (7, ("a",))]
            consumed.set()
            await broker.connections(2)
            assert await take(stream, 2) == [(9, ("b",)), (11, ("a", "b"))]
            assert stream.dropped_duplicates == 0
        assert broker.sent[1][0]["resumeAfter"] == [7, 3]  # a consumed 7, b only 3 (9 came again)
        assert set(await broker.acks(1)) <= {9, 11}  # 7 would name b's line 9, unconsumed
        assert client.positions == {"a": 11, "b": 11}
        await client.close()


async def test_lines_the_protocol_does_not_allow_never_reach_the_application():
    bad_status = b'{"error": "x", "field": "f", "status": [1]}\n'
    async with ScriptedBroker(
        lines(line(1, "a", "victim")),  # a subscription this connection does not carry
        lines(line(2**63, "a")),  # beyond any sequence number
        lines(line(2, "a", "a")),  # one subscription twice
        lines(line(3)),  # no subscriptions named
        lines(bad_status),  # an error document of the wrong types
        lines(b'{"error" cut short\n'),
        lines(line(5, "a")),
        forever(),
    ) as broker:
        client = broker.client()
        async with client.multiplexed(["a"]) as stream:
            assert await take(stream, 1) == [(5, ("a",))]
            assert stream.reconnects == 6 and stream.dropped_duplicates == 0
        assert client.positions == {"a": 5}
        assert all("resumeAfter" not in sent[0] for sent in broker.sent[:7])  # nothing was taken from them
        await client.close()


async def test_a_sealed_payload_that_does_not_open_is_reported_on_its_delivery_and_the_stream_goes_on():
    """One member sealing garbage (or a broker altering it) must not stop the scope's subscribers."""

    def sealed(seq: int, value: str) -> bytes:
        publication = {"n": seq, "veil:scope": "customs", "veil:sealed": value}
        return orjson.dumps({"seq": seq, "id": f"p{seq}", "publication": publication}) + b"\n"

    async with ScriptedBroker(lines(sealed(1, "not base64!"), sealed(2, "AAAA"), line(3), stay=True)) as broker:
        client = VeilClient("http://127.0.0.1:1", auth_hash="h", tcp_port=broker.port, recipient_key=RECIPIENT)
        async with client.deliveries("s") as stream, asyncio.timeout(20):
            got = [await anext(stream) for _ in range(3)]
        await client.close()
    assert [(d.seq, d.payload) for d in got] == [(1, None), (2, None), (3, None)]
    assert "not base64" in got[0].payload_error and "too short" in got[1].payload_error
    assert got[2].payload_error is None


async def test_a_replayed_or_misattributed_sealed_publication_is_reported_and_the_stream_goes_on():
    """A hostile broker delivers one sealed publication twice under new sequence numbers, and one
    under another publisher's name: the first copy opens, the others say why they are not authentic."""
    key = ScopeKey.new("customs")
    sealed = seal_publication({"n": 1}, b"manifest", key, "alice")

    def delivery(seq: int, publisher: str, *ids: str) -> bytes:
        doc = {"seq": seq, "id": "7", "publisher": publisher, "publication": sealed}
        return orjson.dumps(doc | ({"subscriptionIds": list(ids)} if ids else {})) + b"\n"

    script = lines(delivery(1, "alice"), delivery(2, "alice"), delivery(3, "mallory"), stay=True)
    async with ScriptedBroker(script) as broker:
        client = VeilClient("http://127.0.0.1:1", auth_hash="h", tcp_port=broker.port)
        client.keyring = OpenedKeyring(key)
        async with client.deliveries("s") as stream, asyncio.timeout(20):
            got = [await anext(stream) for _ in range(3)]
        await client.close()
    assert got[0].payload == b"manifest" and got[0].origin.publisher == "alice" and got[0].payload_error is None
    assert got[1].payload is None and "a replay" in got[1].payload_error
    assert got[2].payload is None and "published by 'mallory'" in got[2].payload_error
    # the same publication to two subscriptions of one stream is no replay; to one of them again, it is
    window = ReplayWindow()
    origin = origin_of(sealed)
    assert not window.replayed(origin, ("a",)) and not window.replayed(origin, ("b",))
    assert window.replayed(origin, ("a", "c"))


class OpenedKeyring(ScopeKeyring):
    """A keyring holding one key already (its roster checks are test_rosters' business)."""

    def __init__(self, key: ScopeKey) -> None:
        super().__init__(RECIPIENT, {}, lambda *_: None)
        self._keys[(key.scope, key.version)] = key


async def test_a_key_that_cannot_be_fetched_is_reported_on_its_delivery_and_the_stream_goes_on():
    """The broker answers the key request with junk or 503: the delivery, consumed already, says so."""
    key = ScopeKey.new("customs")
    sealed = seal_publication({"n": 1}, b"manifest", key, "alice")
    doc = orjson.dumps({"seq": 1, "id": "1", "publisher": "alice", "publication": sealed}) + b"\n"

    class Failing(ScopeKeyring):
        def __init__(self) -> None:
            async def fetch(scope, version):
                raise Overloaded("", "delivery is behind", 503)

            super().__init__(RECIPIENT, {}, fetch)

    async with ScriptedBroker(lines(doc, line(2), stay=True)) as broker:
        client = VeilClient("http://127.0.0.1:1", auth_hash="h", tcp_port=broker.port)
        client.keyring = Failing()
        async with client.deliveries("s") as stream, asyncio.timeout(20):
            got = [await anext(stream) for _ in range(2)]
        await client.close()
    assert got[0].payload is None and "could not be fetched" in got[0].payload_error and got[1].seq == 2
