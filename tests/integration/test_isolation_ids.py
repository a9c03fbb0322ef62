"""Subscription ids between hostile clients: an id freed by its owner and taken by another client is
a new subscription that carries nothing of the old one, on every delivery path, whether the pipeline
is behind (paused) or keeping up; and a client cannot tell an id (or a scope) someone else holds
from one that does not exist."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, client_for, run_id
from veil.client import Delivery, VeilClient, VeilError
from veil.harness import BrokerProcess

REGISTRY = {"rules": {"*": [[]]}, "scopes": {"customs": {"users": ["alice", "carol"], "managers": ["carol"]}}}
QUEUED = 20  # alice's matches waiting when she unsubscribes
KINDS = ("plain", "enveloped", "multiplexed", "topkw")
TOP = {"k": 3, "w": 600_000, "score": [{"key": "n", "prefer": "high"}]}
QUIET = 3.0  # seconds without a delivery after which a stream counts as drained


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("isolation-ids"))
    path = os.path.join(directory, "registry.json")
    with open(path, "w") as handle:
        json.dump(REGISTRY, handle)
    process = BrokerProcess(os.path.join(directory, "data"), "--registry", path).start()
    yield process
    process.close()


def _tree(pid: int) -> list[int]:
    """The process and its descendants (the pipeline's JVM and Python workers)."""
    found = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as handle:
            for child in handle.read().split():
                found += _tree(int(child))
    return found


def _writable(broker: BrokerProcess) -> bool:
    """Whether the store takes a write now (a process stopped inside its write transaction would
    hold SQLite's one write lock for as long as it is stopped)."""
    db = sqlite3.connect(os.path.join(broker.data_dir, "veil.db"), timeout=0.2)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


@contextlib.contextmanager
def pipeline_paused(broker: BrokerProcess) -> Iterator[None]:
    """The pipeline stopped (SIGSTOP, its whole process tree) while the block runs: what is logged
    meanwhile is matched only after it, as when the pipeline lags behind. Stopped again a moment later
    if it was stopped inside a write transaction."""
    pid = broker.pipeline_pid()
    assert pid is not None
    pids = _tree(pid)
    for _ in range(50):
        for each in pids:
            os.kill(each, signal.SIGSTOP)
        if _writable(broker):
            break
        for each in pids:
            os.kill(each, signal.SIGCONT)
        time.sleep(0.05)
    else:
        raise AssertionError("the pipeline always held the store's write lock")
    try:
        yield
    finally:
        for each in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)


def only(rid: str, whose: str) -> list[dict]:
    return [{"key": "run", "val": rid, "op": "eq"}, {"key": "for", "val": whose, "op": "eq"}]


async def drained(stream) -> list[Delivery]:
    """Every delivery until the stream has been quiet for QUIET seconds."""
    got: list[Delivery] = []
    with contextlib.suppress(TimeoutError):
        while True:
            async with asyncio.timeout(QUIET):
                got.append(await stream.__anext__())
    return got


class Freed:
    """One id alice frees with matches queued, and mallory's subscription under it, over one kind of
    delivery connection."""

    def __init__(self, broker: BrokerProcess, kind: str, rid: str) -> None:
        self.kind = kind
        self.rid = rid
        self.sub_id = f"freed-{kind}-{rid}"
        self.alice = client_for(broker, "alice")
        self.mallory = client_for(broker, "mallory")
        self.topk = TOP if kind == "topkw" else None

    async def __aenter__(self) -> Freed:
        await self.alice.__aenter__()
        await self.mallory.__aenter__()
        await self.alice.subscribe(only(self.rid, "alice"), self.sub_id, topk=self.topk, scope="customs")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.alice.__aexit__(*exc)
        await self.mallory.__aexit__(*exc)

    async def take_over(self) -> None:
        """Alice unsubscribes and mallory takes the id at once (as a client polling for it does)."""
        await self.alice.unsubscribe(self.sub_id)
        await self.mallory.subscribe(only(self.rid, "mallory"), self.sub_id, topk=self.topk)

    def stream(self):
        if self.kind == "plain":
            return self.mallory.deliveries(self.sub_id, envelope=False)
        if self.kind == "multiplexed":
            return self.mallory.multiplexed([self.sub_id])
        return self.mallory.deliveries(self.sub_id)


async def publish_for_alice(carol: VeilClient, rid: str) -> None:
    """Scoped publications (customs: alice is a member, mallory is not), each matching every alice."""
    await carol.publish_batch([{"run": rid, "for": "alice", "n": n, "veil:scope": "customs"} for n in range(QUEUED)])


@pytest.mark.parametrize("pipeline", ["paused", "running"])
async def test_a_freed_id_carries_nothing_of_its_previous_owner(broker, pipeline):
    rid = run_id()
    cases = [Freed(broker, kind, rid) for kind in KINDS]
    async with contextlib.AsyncExitStack() as stack:
        carol = await stack.enter_async_context(client_for(broker, "carol"))
        for case in cases:
            await stack.enter_async_context(case)
        await asyncio.to_thread(broker.wait_processed)
        # valid for the subscriptions to come, logged before the id is freed: mallory's own initial match
        valid = await carol.publish({"run": rid, "for": "mallory", "n": -1}, valid_for=600_000)
        paused = pipeline_paused(broker) if pipeline == "paused" else contextlib.nullcontext()
        with paused:
            await publish_for_alice(carol, rid)
            for case in cases:
                await case.take_over()
            streams = [await stack.enter_async_context(case.stream()) for case in cases]
            if pipeline == "paused":
                await asyncio.sleep(1)  # mallory's connections are live before the pipeline goes on
        received = await asyncio.gather(*(drained(stream) for stream in streams))
    # per kind of connection: how many of alice's matches mallory received, and what of her own
    mine = {"run": rid, "for": "mallory", "n": -1}
    found = {
        case.kind: (
            sum(d.publication.get("for") != "mallory" for d in got),
            [d.publication for d in got if d.publication.get("for") == "mallory"],
        )
        for case, got in zip(cases, received, strict=True)
    }
    # (a top-k/w subscription takes no initial matches: it ranks what comes after it)
    assert found == {kind: (0, [] if kind == "topkw" else [mine]) for kind in KINDS}
    enveloped = [d.id for case, got in zip(cases, received, strict=True) if case.kind != "plain" for d in got]
    assert enveloped == [valid, valid]  # the enveloped and the multiplexed stream say which publication it is


async def test_a_retaken_id_gets_its_own_initial_matches_from_the_store(broker):
    """Mallory connects after the pipeline recorded her initial match of a publication logged before
    alice freed the id: it is read from the store (where a floor at the unsubscription cut it)."""
    rid = run_id()
    async with client_for(broker, "carol") as carol, Freed(broker, "enveloped", rid) as case:
        valid = await carol.publish({"run": rid, "for": "mallory", "n": -1}, valid_for=600_000)
        await publish_for_alice(carol, rid)
        await asyncio.to_thread(broker.wait_processed)
        await case.take_over()
        await asyncio.to_thread(broker.wait_processed)
        await asyncio.sleep(1)  # the gateway has offered the feed to whom it had: mallory reads the store
        async with case.stream() as stream:
            got = await drained(stream)
    assert [(d.id, d.publication["for"]) for d in got] == [(valid, "mallory")]


async def test_another_clients_subscription_is_answered_as_one_that_does_not_exist(broker):
    """Whether an id is held by someone else is not told: a delivery handshake (plain, WebSocket,
    multiplexed) and an unsubscription get the answer an id nobody holds gets. Only subscribing
    under it is refused (ids are global), and any answer to that tells whether it is free."""
    rid = run_id()
    held, absent = f"held-{rid}", f"absent-{rid}"
    async with client_for(broker, "alice") as alice, client_for(broker, "mallory") as mallory:
        await alice.subscribe(only(rid, "alice"), held)

        def same(answers: list[dict | bytes]) -> None:
            first, second = (orjson.dumps(a) if isinstance(a, dict) else a for a in answers)
            assert first.replace(held.encode(), absent.encode()) == second

        for handshake in ({"subscriptionId": "{}"}, {"subscriptionIds": ["{}"]}):
            answers = []
            for sub_id in (held, absent):
                doc = json.loads(json.dumps(handshake).replace("{}", sub_id))
                conn = await LineConnection.open(broker.tcp_port, {"authHash": "mallory", **doc})
                answers.append(await conn.line())
                conn.close()
            assert answers[0]["status"] == 404
            same(answers)
        answers = []
        async with aiohttp.ClientSession() as http:
            for sub_id in (held, absent):
                async with http.ws_connect(f"ws://127.0.0.1:{broker.ws_port}/") as ws:
                    await ws.send_str(orjson.dumps({"authHash": "mallory", "subscriptionId": sub_id}).decode())
                    answers.append(orjson.loads((await ws.receive(timeout=10)).data))
        same(answers)
        refusals = []
        for sub_id in (held, absent):
            with pytest.raises(VeilError) as refused:
                await mallory.unsubscribe(sub_id)
            refusals.append(
                {"status": refused.value.status, "field": refused.value.field, "problem": refused.value.problem}
            )
        same(refusals)
        with pytest.raises(VeilError) as taken:
            await mallory.subscribe([], held)
        assert taken.value.status == 403
        async with aiohttp.ClientSession() as http:
            bodies = []
            for scope in ("customs", "nowhere"):
                async with http.get(f"{broker.url}/scopes/{scope}", headers={"X-Auth-Hash": "mallory"}) as response:
                    bodies.append((response.status, (await response.read()).replace(b"customs", b"nowhere")))
        assert bodies[0] == bodies[1] and bodies[0][0] == 404
