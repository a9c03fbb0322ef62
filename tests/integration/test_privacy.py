"""Privacy against the infrastructure (SPEC §7), over three independently run brokers: sealed
payloads for a scope's members and secret-forwarded ones (n = 3, k = 2) reach their subscribers
while no broker's store, checkpoint or log holds the plaintext, a key that opens it, or another
broker's share; forwarded publications survive a broker that alters every share it forwards and a
broker that is down; scopes keep publications inside except through their interface, and a member
removed from a scope neither receives nor can open what is sealed after its removal. An operator who
acts (a gateway and delivery port of its own in front of a real broker, and the broker's admin API)
gets no scope key it can use and no plaintext: substituted envelopes, rosters it signed, rolled-back
versions, members it added and recipient keys it swapped are refused or reported by the clients,
replayed sealed publications are reported, and forwarded publications open although one broker
floods invented forwarding ids and replays copies."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from tests.integration.helpers import nothing_more, run_id, take
from tests.integration.hostile_operator import HostileGateway, Relay
from veil.client import VeilClient
from veil.client.errors import UntrustedKey
from veil.client.forwarding import ForwardingPublisher, split_publication, subscribe_forwarded
from veil.client.sealed import associated_data
from veil.harness import BrokerProcess
from veil.harness.broker import free_ports
from veil.protocol.reserved import FORWARD, SEALED
from veil.security import shamir
from veil.security.rosters import Roster, envelope_digest, sign_roster
from veil.security.sealing import ScopeKey, SealError, open_sealed, recipient_public, unwrap, wrap

pytestmark = pytest.mark.slow
USERS = ("alice", "bob", "carol", "dave", "erin", "root")
RECIPIENT = {user: X25519PrivateKey.generate() for user in USERS}
MANAGER = Ed25519PrivateKey.generate()  # carol's: she signs the customs rosters, members pin it
MANAGER_PUBLIC = base64.b64encode(MANAGER.public_key().public_bytes_raw()).decode()
VOUCHED = {user: recipient_public(key) for user, key in RECIPIENT.items()}  # what carol knows of members' keys


async def rotate(carol: VeilClient) -> int:
    return (await carol.rotate_scope_key("customs", ("carol-1", MANAGER), VOUCHED)).version


def secret(user: str) -> str:
    return f"{user}-secret-1"


def registry(customs: list[str]) -> dict:
    return {
        "admins": ["root"],
        "hashes": {secret(u): u for u in USERS},
        "rules": {"*": [[]]},
        "keys": {"carol": {"carol-1": MANAGER_PUBLIC}},
        "recipients": {u: base64.b64encode(recipient_public(k)).decode() for u, k in RECIPIENT.items()},
        "scopes": {
            "customs": {
                "users": customs,
                "managers": ["carol"],
                "export": [[{"key": "kind", "op": "eq", "val": "summary"}]],
            }
        },
    }


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    """Three deployments, each with its own store, Spark and registry (the same content)."""
    processes = []
    for i in range(3):
        directory = str(tmp_path_factory.mktemp(f"broker{i}"))
        path = os.path.join(directory, "registry.json")
        with open(path, "w") as handle:
            json.dump(registry(["alice", "bob", "carol"]), handle)
        processes.append(
            BrokerProcess(
                os.path.join(directory, "data"), "--registry", path, "--auth", "hash", "--anonymous", "false"
            ).start(wait_ready=False)
        )
    for process in processes:
        process.wait_ready()
    yield processes
    for process in processes:
        process.close()


def client(broker: BrokerProcess, user: str, tcp_port: int | None = None, url: str | None = None) -> VeilClient:
    return VeilClient(
        url or broker.url, auth_hash=secret(user), tcp_port=tcp_port or broker.tcp_port, ws_port=broker.ws_port,
        recipient_key=RECIPIENT[user], scope_managers={"customs": {"carol-1": MANAGER_PUBLIC}},
    )  # fmt: skip


def encodings(value: bytes) -> list[bytes]:
    """The ways a secret could sit in a file: raw, hex, and base64 at each of the three alignments it
    could have inside a longer base64 text."""
    found = [value, value.hex().encode()]
    for pad in range(3):
        text = base64.b64encode(b"\0" * pad + value + b"\0\0")
        found.append(text[-(-pad * 4 // 3) : ((pad + len(value)) * 4) // 3])
    return found


def files_holding(directory: str, secrets: list[bytes]) -> list[str]:
    held = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                content = handle.read()
            held += [f"{path}: {s[:12]!r}..." for s in secrets if s in content]
    return held


async def test_no_broker_holds_a_sealed_or_forwarded_canary(brokers):
    rid = run_id()
    sealed_canary = f"canary sealed {rid} {os.urandom(8).hex()}".encode()
    forwarded_canary = f"canary forwarded {rid} {os.urandom(8).hex()}".encode()
    scope_keys = []
    for broker in brokers:
        async with client(broker, "carol") as carol:
            await rotate(carol)
    members = [client(b, "bob") for b in brokers]
    publishers = [client(b, "alice") for b in brokers]
    erin = [client(b, "erin") for b in brokers]
    try:
        streams = []
        for bob in members:
            await bob.subscribe([{"key": "rid", "op": "eq", "val": rid}], f"sealed-{rid}", scope="customs")
            streams.append(bob.deliveries(f"sealed-{rid}"))
        forwarded = await subscribe_forwarded(erin, [{"key": "rid", "op": "eq", "val": rid}], 2, f"fw-{rid}")
        async with forwarded:
            for stream in streams:
                await stream.__aenter__()
            for alice in publishers:
                await alice.publish({"rid": rid, "kind": "detail"}, seal="customs", payload=sealed_canary)
                scope_keys.append((await alice.keyring.key("customs")).secret)
            documents = split_publication({"rid": rid}, forwarded_canary, 2, 3)
            for alice, document in zip(publishers, documents, strict=True):
                await alice.publish(document)  # what ForwardingPublisher does, with the shares in sight
            forward_id = documents[0][FORWARD]["id"]
            forwarded_shares = [base64.b64decode(d[FORWARD]["share"]) for d in documents]
            for stream in streams:
                [delivery] = await take(stream, 1)
                assert delivery.payload == sealed_canary
                assert SEALED in delivery.publication and sealed_canary.decode() not in orjson.dumps(delivery.publication).decode()
            async with asyncio.timeout(60):
                opened = await forwarded.__anext__()
            assert (opened.id, opened.payload, opened.corrupted) == (forward_id, forwarded_canary, ())
            for stream in streams:
                await stream.aclose()
    finally:
        for c in [*members, *publishers, *erin]:
            await c.close()
    payload_key = shamir.combine([shamir.Share.from_bytes(s) for s in forwarded_shares[:2]])
    for i, broker in enumerate(brokers):
        broker.wait_processed()
        others = [s for j, s in enumerate(forwarded_shares) if j != i]
        secrets = [*encodings(sealed_canary), *encodings(forwarded_canary), *encodings(payload_key)]
        secrets += [e for key in scope_keys for e in encodings(key)] + [e for s in others for e in encodings(s)]
        assert files_holding(broker.data_dir, secrets) == []
        assert files_holding(broker.data_dir, encodings(forwarded_shares[i])), "the test looks in the right place"


class LyingRelay:
    """A broker's delivery port as seen through an operator who alters every share it forwards."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_ports(1)[0]
        self.altered = 0

    async def __aenter__(self) -> LyingRelay:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)

        async def upward() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        task = asyncio.create_task(upward())
        try:
            while line := await up_reader.readline():
                writer.write(self._alter(line))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            task.cancel()
            up_writer.close()
            writer.close()

    def _alter(self, line: bytes) -> bytes:
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            return line
        fields = doc.get("publication", {}).get(FORWARD) if isinstance(doc, dict) else None
        if not isinstance(fields, dict):
            return line
        share = shamir.Share.from_bytes(base64.b64decode(fields["share"]))
        fields["share"] = base64.b64encode(share._replace(value=(share.value * 3 + 1) % shamir.PRIME).to_bytes()).decode()
        self.altered += 1
        return orjson.dumps(doc) + b"\n"


async def test_forwarded_publications_open_although_one_broker_alters_every_share(brokers):
    rid, count = run_id(), 20
    async with LyingRelay(brokers[2].tcp_port) as relay:
        readers = [client(brokers[0], "erin"), client(brokers[1], "erin"), client(brokers[2], "erin", relay.port)]
        publishers = [client(b, "dave") for b in brokers]
        try:
            forwarded = await subscribe_forwarded(readers, [{"key": "rid", "op": "eq", "val": rid}], 2)
            readers[2].tcp_port = relay.port  # the subscribe reply named the broker's own port
            async with forwarded:
                sent = {}
                for n in range(count):
                    payload = f"{rid} #{n}".encode()
                    forward_id, _ = await ForwardingPublisher(publishers, 2).publish({"rid": rid, "n": n}, payload)
                    sent[forward_id] = payload
                got = {}
                async with asyncio.timeout(60):
                    while len(got) < count:
                        opened = await forwarded.__anext__()
                        got[opened.id] = opened.payload
                        assert 2 not in opened.brokers
                    while len(forwarded.corrupted) < count:  # the liar's shares that came after opening
                        await asyncio.sleep(0.1)
                assert got == sent
                assert sorted(forwarded.corrupted) == sorted((forward_id, 2) for forward_id in sent)
                assert relay.altered >= count
        finally:
            for c in [*readers, *publishers]:
                await c.close()


async def test_a_scope_keeps_its_publications_and_a_removed_member_loses_them(brokers):
    broker, rid = brokers[0], run_id()
    mine = [{"key": "rid", "op": "eq", "val": rid}]
    alice, bob, carol, dave, root = (client(broker, u) for u in ("alice", "bob", "carol", "dave", "root"))
    try:
        await rotate(carol)
        await bob.subscribe(mine, f"bob-{rid}", scope="customs")
        await carol.subscribe(mine, f"carol-{rid}", scope="customs")
        await dave.subscribe(mine, f"dave-{rid}")  # the world
        async with (
            bob.deliveries(f"bob-{rid}") as bob_stream,
            carol.deliveries(f"carol-{rid}") as carol_stream,
            dave.deliveries(f"dave-{rid}") as dave_stream,
        ):
            await alice.publish({"rid": rid, "kind": "detail"}, seal="customs", payload=b"for members")
            await alice.publish({"rid": rid, "kind": "summary"}, seal="customs", payload=b"exported")
            assert [d.payload for d in await take(bob_stream, 2)] == [b"for members", b"exported"]
            await take(carol_stream, 2)
            [outside] = await take(dave_stream, 1)  # only what the interface lets out, and sealed
            assert (outside.publication["kind"], outside.payload) == ("summary", None)

            document = await root.registry()
            document["scopes"]["customs"]["users"] = ["alice", "carol"]
            await root.registry(document)
            old_key = await bob.keyring.key("customs")
            await rotate(carol)
            await alice.publish({"rid": rid, "kind": "detail"}, seal="customs", payload=b"after bob left")
            [later] = await take(carol_stream, 1)
            assert later.payload == b"after bob left"
            await nothing_more(bob_stream)
            assert await bob.keyring.open(later.publication) is None  # no envelope of the new key for bob
            raw = base64.b64decode(later.publication[SEALED])
            with pytest.raises(SealError):
                open_sealed(raw, old_key, associated_data(later.publication))
            await nothing_more(dave_stream)
    finally:
        for c in (alice, bob, carol, dave, root):
            await c.close()


def pem(user: str, directory) -> str:
    path = os.path.join(directory, f"{user}.pem")
    with open(path, "wb") as handle:
        handle.write(RECIPIENT[user].private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path


async def test_the_command_line_rotates_seals_and_opens(brokers, tmp_path):
    broker, rid = brokers[0], run_id()
    managers, recipients, signing = tmp_path / "managers.json", tmp_path / "recipients.json", tmp_path / "carol-signing.pem"
    managers.write_bytes(orjson.dumps({"customs": {"carol-1": MANAGER_PUBLIC}}))
    recipients.write_bytes(orjson.dumps({u: base64.b64encode(k).decode() for u, k in VOUCHED.items()}))
    signing.write_bytes(MANAGER.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    flags = ["--url", broker.url, "--scope-managers", str(managers)]
    rotation = ["--signing-key", str(signing), "--key-id", "carol-1", "--recipients", str(recipients)]

    async def veil(user: str, *args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "veil.cli", *args, *flags, "--auth-hash", secret(user),
            "--recipient-key", pem(user, tmp_path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        return out.decode()

    assert "key version" in await veil("carol", "scope", "rotate", "customs", *rotation)
    assert "key version" in await veil("carol", "scope", "rotate", "customs", *rotation[:4])  # the last roster's
    periodic = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "veil.cli", "scope", "rotate", "customs", *rotation, "--every", "1", *flags,
        "--auth-hash", secret("carol"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert periodic.stdout is not None
    async with asyncio.timeout(30):
        versions = [int((await periodic.stdout.readline()).split()[4]) for _ in range(2)]
    periodic.terminate()
    await periodic.wait()
    assert versions[1] == versions[0] + 1  # rotated again a second later
    async with client(broker, "carol") as carol:  # a member whichever tests ran before
        await carol.subscribe([{"key": "rid", "op": "eq", "val": rid}], f"cli-{rid}", scope="customs")
        async with carol.deliveries(f"cli-{rid}") as stream:
            await stream.connected.wait()
            await veil("alice", "publish", "--seal", "customs", "--payload", "from the shell", orjson.dumps({"rid": rid}).decode())
            [delivery] = await take(stream, 1)
    assert delivery.payload == b"from the shell"
    assert delivery.publication["veil:scope"] == "customs" and "from the shell" not in str(delivery.publication)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def test_a_hostile_gateway_gets_no_scope_key_it_can_use(brokers):
    broker = brokers[0]
    canary = f"canary hostile {run_id()} {os.urandom(8).hex()}".encode()
    operator = X25519PrivateKey.generate()  # the recipient key the operator gives members it adds or swaps
    operator_signing = Ed25519PrivateKey.generate()
    alice_public = recipient_public(RECIPIENT["alice"])
    async with HostileGateway(broker.url) as gateway:
        alice, carol, root = client(broker, "alice", url=gateway.url), client(broker, "carol"), client(broker, "root")
        try:
            await rotate(carol)
            chosen = ScopeKey.new("customs", 1000)

            def forged(_, answer: dict) -> dict:  # a key the operator chose, under a roster it signed
                envelope = wrap(chosen, alice_public)
                roster = Roster("customs", chosen.version, {"alice": alice_public}, {"alice": envelope_digest(envelope)})
                signed = sign_roster(roster, "carol-1", operator_signing).document()
                return {"scope": "customs", "version": chosen.version, "envelope": b64(envelope), **signed}

            def swapped(_, answer: dict) -> dict:  # carol's roster, with an envelope of the operator's key
                return answer | {"envelope": b64(wrap(chosen._replace(version=answer["version"]), alice_public))}

            for rewrite, problem in ((forged, "not signed by a manager you pin"), (swapped, "no such envelope")):
                gateway.rewrites["/scopes/customs/key"] = rewrite
                with pytest.raises(UntrustedKey, match=problem):
                    await alice.publish({"kind": "detail"}, seal="customs", payload=canary)
            assert not any(SEALED in p for p in gateway.published), "nothing was sealed under a key it chose"

            del gateway.rewrites["/scopes/customs/key"]
            await alice.publish({"kind": "detail"}, seal="customs", payload=canary)  # the current version
            await rotate(carol)
            await alice.publish({"kind": "detail"}, seal="customs", payload=canary)  # 409, then the newest
            seen = alice.keyring.seen["customs"]
            await rotate(carol)

            stale = await gateway.upstream_json(f"/scopes/customs/key?version={seen - 1}", secret("alice"))
            gateway.rewrites["/scopes/customs/key"] = lambda *_: stale  # "the newest is seen - 1"
            with pytest.raises(UntrustedKey, match="rollback"):
                await alice.publish({"kind": "detail"}, seal="customs", payload=canary)
            del gateway.rewrites["/scopes/customs/key"]

            # the operator adds a member and swaps bob's recipient key, then carol rotates
            before = await root.registry()
            changed = orjson.loads(orjson.dumps(before))
            changed["hashes"][secret("mallory")] = "mallory"
            changed["scopes"]["customs"]["users"] = [*before["scopes"]["customs"]["users"], "mallory", "bob"]
            changed["recipients"] |= {"mallory": b64(recipient_public(operator)), "bob": b64(recipient_public(operator))}
            await root.registry(changed)
            rotation = await carol.rotate_scope_key("customs", ("carol-1", MANAGER), VOUCHED)
            assert "not among the recipients you gave" in rotation.left_out["mallory"]
            assert "another recipient key" in rotation.left_out["bob"] and "alice" in rotation.members
            for version, stored in (await root.registry())["scopes"]["customs"]["keys"].items():
                for envelope in stored["envelopes"].values():
                    with pytest.raises(SealError):
                        unwrap(base64.b64decode(envelope), "customs", int(version), operator)
            restored = await root.registry()  # as before, with the keys stored since
            restored |= {"hashes": before["hashes"], "recipients": before["recipients"]}
            restored["scopes"]["customs"]["users"] = before["scopes"]["customs"]["users"]
            await root.registry(restored)
            await rotate(carol)
            assert not any(e in gateway.carried for e in encodings(canary))
        finally:
            for c in (alice, carol, root):
                await c.close()


async def test_a_replayed_sealed_publication_is_reported_to_its_subscriber(brokers):
    broker, rid = brokers[0], run_id()
    async with Relay(broker.tcp_port) as relay:
        alice, carol = client(broker, "alice"), client(broker, "carol", tcp_port=relay.port)
        try:
            await rotate(carol)
            await carol.subscribe([{"key": "rid", "op": "eq", "val": rid}], f"replay-{rid}", scope="customs")
            carol.tcp_port = relay.port  # the subscribe reply named the broker's own port
            async with carol.deliveries(f"replay-{rid}") as stream:
                await stream.connected.wait()
                for n in range(2):
                    await alice.publish({"rid": rid, "n": n}, seal="customs", payload=b"order %d" % n)
                assert [d.payload for d in await take(stream, 2)] == [b"order 0", b"order 1"]
                await relay.again(0)
                [replayed] = await take(stream, 1)
                assert replayed.payload is None and "a replay" in replayed.payload_error
                assert replayed.origin.publisher == "alice"
        finally:
            await alice.close()
            await carol.close()


def invented(doc: dict, count: int) -> list[dict]:
    """What a flooding broker sends before each line: copies of publications nobody made."""
    publication = {key: value for key, value in doc["publication"].items() if key != FORWARD}
    copies = []
    for _ in range(count):
        share = shamir.Share(1 + os.urandom(1)[0] % 3, 2, int.from_bytes(os.urandom(16)))
        fields = {"id": os.urandom(16).hex(), "k": 2, "n": 3, "share": b64(share.to_bytes()), "time": 1,
                  "digests": [b64(os.urandom(32)) for _ in range(3)], "sealed": b64(os.urandom(48))}  # fmt: skip
        copies.append({**doc, "id": "0", "publication": {**publication, FORWARD: fields}})
    return copies


async def test_forwarded_publications_open_although_one_broker_floods_and_replays(brokers):
    rid, count, flood = run_id(), 12, 1000
    async with (
        Relay(brokers[2].tcp_port, before=lambda doc: invented(doc, flood)) as flooding,
        Relay(brokers[0].tcp_port) as replaying,
    ):
        readers = [client(brokers[0], "erin", replaying.port), client(brokers[1], "erin"), client(brokers[2], "erin", flooding.port)]
        publishers = [client(b, "dave") for b in brokers]
        try:
            forwarded = await subscribe_forwarded(readers, [{"key": "rid", "op": "eq", "val": rid}], 2)
            readers[0].tcp_port, readers[2].tcp_port = replaying.port, flooding.port
            async with forwarded:
                sent = {}
                for n in range(count):
                    forward_id, _ = await ForwardingPublisher(publishers, 2).publish({"rid": rid, "n": n}, b"%d" % n)
                    sent[forward_id] = b"%d" % n
                got = {}
                async with asyncio.timeout(120):
                    while len(got) < count:
                        opened = await forwarded.__anext__()
                        assert opened.id not in got
                        got[opened.id] = opened.payload
                assert got == sent  # the honest copies of the two other brokers opened them: the flood may still be arriving
                async with asyncio.timeout(60):
                    while len(flooding.passed) < count:
                        await asyncio.sleep(0.05)
                assert len(flooding.passed) >= count  # every honest copy came, each after a thousand invented
                for index in range(len(replaying.passed)):
                    await replaying.again(index)
                with pytest.raises(TimeoutError):  # a replayed copy opens nothing again
                    async with asyncio.timeout(2):
                        await forwarded.__anext__()
        finally:
            for c in [*readers, *publishers]:
                await c.close()


async def test_forwarded_publications_open_with_one_broker_down(brokers):
    rid, count = run_id(), 10
    readers = [client(b, "erin") for b in brokers]
    publishers = [client(b, "dave") for b in brokers]
    try:
        forwarded = await subscribe_forwarded(readers, [{"key": "rid", "op": "eq", "val": rid}], 2)
        async with forwarded:
            brokers[1].kill()
            sent = {}
            for n in range(count):
                forward_id, failures = await ForwardingPublisher(publishers, 2).publish({"rid": rid}, b"%d" % n)
                assert failures[1] is not None and failures[0] is None and failures[2] is None
                sent[forward_id] = b"%d" % n
            got = {}
            async with asyncio.timeout(60):
                while len(got) < count:
                    opened = await forwarded.__anext__()
                    got[opened.id] = opened.payload
            assert got == sent and not forwarded.corrupted
    finally:
        for c in [*readers, *publishers]:
            await c.close()
