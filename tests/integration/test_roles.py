"""A deployment in parts on one PostgreSQL store: two gateways (`--role gateway`) and the pipeline on
its own (`--role pipeline`), in Spark's local mode here and on a standalone cluster of two workers.
Publishers post to either gateway and subscribers read from either; a gateway or a Spark worker
killed with -9 loses nothing acknowledged, and a subscription is delivered through one gateway at
a time."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.integration.helpers import Consumers, LineConnection, SteadyPublisher, client_for, run_id
from veil.harness import BrokerProcess, SparkCluster

pytestmark = pytest.mark.slow
# executors come and go with the load (one to start with, as many as the workers allow)
DYNAMIC_ALLOCATION = tuple(
    flag
    for setting in (
        "spark.dynamicAllocation.enabled=true", "spark.dynamicAllocation.shuffleTracking.enabled=true",
        "spark.dynamicAllocation.initialExecutors=1", "spark.dynamicAllocation.minExecutors=1",
        "spark.dynamicAllocation.maxExecutors=2", "spark.dynamicAllocation.schedulerBacklogTimeout=1s",
        "spark.dynamicAllocation.executorIdleTimeout=10s", "spark.executor.cores=1",
    )
    for flag in ("--spark-conf", setting)
)  # fmt: skip



def start_deployment(tmp_path, store_url: str, *pipeline_flags: str) -> list[BrokerProcess]:
    """Gateways A and B, then the pipeline (started last: it waits for the store a gateway creates)."""
    store = ("--store", store_url, "--partitions", "2")
    gateways = [
        BrokerProcess(str(tmp_path / name), "--role", "gateway", "--gateway-id", name, *store).start(wait_ready=False)
        for name in ("A", "B")
    ]
    pipeline = BrokerProcess(str(tmp_path / "pipeline"), "--role", "pipeline", *store, *pipeline_flags)
    processes = [*gateways, pipeline.start(wait_ready=False)]
    try:
        for gateway in gateways:
            gateway.wait_ready()
    except Exception:
        stop_deployment(processes)
        raise
    return processes


def stop_deployment(processes: list[BrokerProcess]) -> None:
    for process in processes:
        process.close()


@pytest.fixture
def local_deployment(tmp_path, postgres_url):
    processes = start_deployment(tmp_path, postgres_url)
    yield processes
    stop_deployment(processes)


@pytest.fixture
def cluster(tmp_path):
    spark = SparkCluster(workers=2, hidden=(str(tmp_path),)).start()  # the workers cannot see the data dirs
    yield spark
    spark.stop()


async def run_through_failures(a: BrokerProcess, b: BrokerProcess, kill_worker=None) -> None:
    """Publishers on A, subscribers on B (TCP and WebSocket) and one on A; kill -9 a Spark worker (if
    given), then A, and move the publishers and A's subscriber to B: every acknowledged publication
    arrives once, in order."""
    rid = run_id()
    run = {"key": "run", "val": rid, "op": "eq"}
    async with client_for(a, "pam") as at_a, client_for(b, "pam") as at_b:
        everything = (await at_a.subscribe([run]))["subscriptionId"]
        evens = (await at_b.subscribe([run, {"key": "even", "val": True, "op": "eq"}]))["subscriptionId"]
        mover = (await at_a.subscribe([run]))["subscriptionId"]
        consumers = Consumers(
            {
                everything: at_b.deliveries(everything),
                evens: at_b.deliveries(evens, transport="ws"),
                mover: at_a.deliveries(mover),
            }
        )
        await consumers.start()
        await at_a.publish({"run": rid, "n": -1, "even": False})
        connected = {everything: [-1], evens: [], mover: [-1]}
        await consumers.expect_exactly_once_in_order(connected, connected)

        # one connection per subscription: the same subscriber through gateway A is refused
        second = await LineConnection.open(a.tcp_port, {"subscriptionId": everything, "authHash": "pam"})
        refusal = await second.line()
        second.close()
        assert refusal is not None and refusal["status"] == 503 and "gateway B" in refusal["error"]

        publisher = SteadyPublisher(at_a, rid)
        publisher.start()
        if kill_worker is not None:
            await publisher.until(80)
            await asyncio.to_thread(kill_worker)  # it waits for the worker's executor
        await publisher.until(160, timeout=120)
        a.kill()
        publisher.client = at_b  # the load balancer moves the publishers to the gateway left
        at_b.positions[mover] = at_a.positions[mover]  # and the subscriber, which resumes where it was
        await consumers.move(mover, at_b.deliveries(mover))  # refused until A's claim lapses, then served
        await publisher.until(240, timeout=120)
        publisher.stop()
        acknowledged, attempted = publisher.acknowledged, publisher.attempted
        await consumers.expect_exactly_once_in_order(
            {
                everything: [-1, *acknowledged],
                evens: [n for n in acknowledged if n % 2 == 0],
                mover: [-1, *acknowledged],
            },
            {
                everything: [-1, *attempted],
                evens: [n for n in attempted if n % 2 == 0],
                mover: [-1, *attempted],
            },
            timeout=120,
        )
        await consumers.close()


async def test_publish_anywhere_read_anywhere_and_survive_a_gateway(local_deployment):
    a, b, pipeline = local_deployment
    await run_through_failures(a, b)
    for part, signum in ((pipeline, signal.SIGINT), (b, signal.SIGTERM)):  # Ctrl-C or SIGTERM: a quiet stop
        assert part.stop(signum=signum) == 0
        with open(part.log_path, errors="replace") as log:
            said = log.read()
        assert "Traceback" not in said and "stopped" in said, part.tail()


async def test_on_a_standalone_cluster_survive_a_worker_and_a_gateway(tmp_path, postgres_url, cluster):
    processes = start_deployment(
        tmp_path, postgres_url, *cluster.pipeline_flags(), "--driver-memory", "1g",
        "--spark-conf", "spark.executor.memory=768m", *DYNAMIC_ALLOCATION,
    )  # fmt: skip
    try:
        a, b, pipeline = processes
        await run_through_failures(a, b, kill_worker=cluster.kill_worker)
        with open(pipeline.log_path, errors="replace") as log:
            said = log.read()
        # the epoch ended when the second executor joined, and when the killed worker's left
        assert "joined, none left): the epoch ends now" in said and "none joined," in said, pipeline.tail()
    finally:
        stop_deployment(processes)
