"""Beyond one machine: the SELIS workload (`bench.selis`) on each way of deploying Veil, in one run.

  sqlite          gateway and pipeline in one (`--role all`), SQLite store, Spark local mode: the baseline
  postgres        the same on PostgreSQL
  2 gateways      `--role gateway` twice and `--role pipeline`, PostgreSQL: publishers post to gateway A,
                  subscribers read from gateway B (every delivery crosses the store)
  cluster 1w/2w   the same with the pipeline on a Spark standalone cluster of 1 or 2 workers (1 core each,
                  as many matcher partitions)

For each: publications/s end to end, publish → delivery p50/p99 at a constant rate, and the CPU each
component spent per publication (all processes of the component, from /proc, over the whole case).
PostgreSQL is a throwaway server of the benchmark's own, so that its CPU is the store's alone. On two
cores the point is the overhead of each part, not a speed-up. As in `bench.selis`, a phase whose
deliveries are not exactly the ones its acknowledged publications should make prints how many
arrived instead of its figures.

    python -m bench.deploy [--subscriptions 1,128,512] [--seconds 5] [--only sqlite,postgres,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench.brokers import subscription_counts
from bench.cpu import cpu_seconds
from bench.report import print_table
from bench.selis import arrived, checked, complete, run_case
from veil.harness import BrokerProcess, PostgresServer, SparkCluster, postgres_database

KINDS = ("sqlite", "postgres", "2 gateways", "cluster 1w", "cluster 2w")


@dataclass
class Deployed:
    publish: BrokerProcess  # where publishers post and subscriptions are made
    deliver: BrokerProcess  # where subscribers connect
    components: dict[str, Callable[[], float]] = field(default_factory=dict)  # name -> CPU seconds so far


def postmaster(server: PostgresServer) -> int:
    with open(os.path.join(server.data, "postmaster.pid")) as handle:
        return int(handle.readline())


@contextlib.contextmanager
def deployment(kind: str, postgres: PostgresServer) -> Iterator[Deployed]:
    directory = tempfile.mkdtemp(prefix="veil-bench-")
    processes: list[BrokerProcess] = []
    cluster: SparkCluster | None = None
    try:
        with contextlib.ExitStack() as stack:
            store = () if kind == "sqlite" else ("--store", stack.enter_context(postgres_database(postgres.url)))
            if kind in ("sqlite", "postgres"):
                broker = BrokerProcess(os.path.join(directory, "broker"), *store).start()
                processes.append(broker)
                deployed = Deployed(broker, broker)
                deployed.components["gateway"] = lambda: cpu_seconds(broker.process.pid, descendants=False)
                deployed.components["pipeline"] = lambda: cpu_seconds(broker.pipeline_pid())
            else:
                flags: tuple[str, ...] = ()
                if kind.startswith("cluster"):
                    cluster = SparkCluster(workers=int(kind[-2])).start()
                    # a matcher partition's task runs all the time: one per core the cluster has
                    flags = (*cluster.pipeline_flags(), "--driver-memory", "1g", "--partitions", kind[-2])
                gateways = [
                    BrokerProcess(os.path.join(directory, name), "--role", "gateway", "--gateway-id", name, *store)
                    for name in ("A", "B")
                ]
                pipeline = BrokerProcess(os.path.join(directory, "pipeline"), "--role", "pipeline", *store, *flags)
                processes += [*gateways, pipeline]
                for process in processes:
                    process.start(wait_ready=False)
                for gateway in gateways:
                    gateway.wait_ready()
                deployed = Deployed(gateways[0], gateways[1])
                deployed.components["gateway"] = lambda: sum(cpu_seconds(g.process.pid) for g in gateways)
                deployed.components["pipeline"] = lambda: cpu_seconds(pipeline.process.pid)
                if cluster is not None:
                    spark = cluster
                    deployed.components["executors"] = lambda: sum(cpu_seconds(w.pid) for w in spark.workers if w)
            if store:
                deployed.components["postgres"] = lambda: cpu_seconds(postmaster(postgres))
            yield deployed
            for process in processes:
                process.close()
    finally:
        for process in processes:
            process.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def measure(kind: str, postgres: PostgresServer, counts: list[int], seconds: float, rate: float) -> list[dict]:
    rows = []
    with deployment(kind, postgres) as deployed:
        await run_case(deployed.publish, 8, 3, rate, 1, deployed.deliver)  # warm-up
        for n in counts:
            before = {name: read() for name, read in deployed.components.items()}
            row = await run_case(deployed.publish, n, seconds, rate, 1, deployed.deliver)
            spent = {name: read() - before[name] for name, read in deployed.components.items()}
            row.update(kind=kind, cpu={name: value / max(1, row["published"]) for name, value in spent.items()})
            rows.append(row)
            print(kind, {k: v for k, v in row.items() if k != "cpu"}, row["cpu"], flush=True)
    return rows


def print_rows(rows: list[dict]) -> None:
    def us(component: str) -> Callable[[dict], object]:
        return lambda r: f"{r['cpu'][component] * 1e6:.0f}" if component in r["cpu"] else None

    print_table(
        f"SELIS lat/lon workload by deployment, one publication per POST; {os.cpu_count()} cores; "
        "CPU in µs per publication",
        [
            ("deployment", 12, lambda r: r["kind"]),
            ("subs", 5, lambda r: r["subs"]),
            ("e2e pub/s", 10, lambda r: checked(r, "flat out", f"{r['sustained']:.0f}")),
            ("vs sqlite", 9, lambda r: f"{r['ratio']:.2f}" if r.get("ratio") else None),
            ("p50 ms", 7, lambda r: checked(r, "steady", f"{r['p50'] * 1000:.0f}")),
            ("p99 ms", 7, lambda r: checked(r, "steady", f"{r['p99'] * 1000:.0f}")),
            ("gateway", 8, us("gateway")),
            ("pipeline", 9, us("pipeline")),
            ("executors", 10, us("executors")),
            ("postgres", 9, us("postgres")),
            ("total", 7, lambda r: f"{sum(r['cpu'].values()) * 1e6:.0f}"),
            ("arrived at pub/s", 17, lambda r: arrived(r, "steady")),
            ("arrived flat out", 17, lambda r: arrived(r, "flat out")),
        ],
        rows,
    )


async def main_async(args: argparse.Namespace) -> None:
    postgres = PostgresServer().start()
    rows: list[dict] = []
    try:
        for kind in args.only:
            rows += await measure(kind, postgres, args.subscriptions, args.seconds, args.rate)
    finally:
        postgres.stop()
    baseline = {r["subs"]: r["sustained"] for r in rows if r["kind"] == "sqlite" and complete(r, "flat out")}
    for row in rows:
        if row["subs"] in baseline and complete(row, "flat out"):
            row["ratio"] = row["sustained"] / baseline[row["subs"]]
    print_rows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=subscription_counts, default=[1, 128, 512])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=200.0, help="publications/s in the latency phase")
    parser.add_argument("--only", type=lambda text: text.split(","), default=list(KINDS), help=", ".join(KINDS))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
