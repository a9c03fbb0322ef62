"""Beyond one machine: the SELIS workload (`bench.selis`) on each way of deploying Veil, in one run.

  sqlite          gateway and pipeline in one (`--role all`), SQLite store, Spark local mode: the baseline
  postgres        the same on PostgreSQL
  2 gateways      `--role gateway` twice and `--role pipeline`, PostgreSQL: publishers post to gateway A,
                  subscribers read from gateway B (every delivery crosses the store)
  cluster 1w/2w   the same with the pipeline on a Spark standalone cluster of 1 or 2 workers (1 core each,
                  as many matcher partitions)

For each: publications/s end to end, publish → delivery p50/p99 at a constant rate, and the CPU each
component spent per publication (all processes of the component, from /proc, over the saturation
phase: from its first publication to its last delivery). PostgreSQL is a throwaway server of the
benchmark's own, so that its CPU is the store's alone; on it, over the same phase, the statements the
broker sent, the time each of the store's write locks was held and the time waited for one, per
publication (`bench.store_load`). Each deployment runs with each of `--partitions` matcher partitions
and `--modes` (subscription or publication partitioning; the clusters have one partition per worker).
On two cores the point is the overhead of each part, not a speed-up. As in `bench.selis`, a phase whose
deliveries are not exactly the ones its acknowledged publications should make prints how many
arrived instead of its figures.

Last, the scale model: from each row's CPU per publication, the cores each component would need at
10k, 100k and 1M publications/s (linear in the rate: gateways and matcher partitions are added side
by side), and one store's ceiling, the rate at which its busier write lock would be held all the time.

    python -m bench.deploy [--subscriptions 1,128,512] [--seconds 5] [--only sqlite,postgres,...]
                           [--partitions 1,2,4] [--modes subscriptions,publications]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench.brokers import subscription_counts
from bench.cpu import TreeCpu, cpu_seconds
from bench.report import Column, print_table
from bench.selis import arrived, checked, complete, run_case
from bench.store_load import SETTINGS, StoreSampler
from veil.harness import BrokerProcess, PostgresServer, SparkCluster, postgres_database

KINDS = ("sqlite", "postgres", "2 gateways", "cluster 1w", "cluster 2w")
MODES = ("subscriptions", "publications")
SCALE = (10_000, 100_000, 1_000_000)  # publications/s the scale model sizes a deployment for


@dataclass
class Deployed:
    publish: BrokerProcess  # where publishers post and subscriptions are made
    deliver: BrokerProcess  # where subscribers connect
    components: dict[str, Callable[[], float]] = field(default_factory=dict)  # name -> CPU seconds so far
    database: str = ""  # the PostgreSQL database's name, if the store is one


def pid_of(process: BrokerProcess) -> int | None:
    return running_pid(process.process) if process.process else None


def running_pid(process: subprocess.Popen) -> int | None:
    """The process's pid while it runs (once it ended, the number may name another process)."""
    return process.pid if process.poll() is None else None


def postmaster(server: PostgresServer) -> int:
    with open(os.path.join(server.data, "postmaster.pid")) as handle:
        return int(handle.readline())


@contextlib.contextmanager
def deployment(kind: str, postgres: PostgresServer, partitions: int = 2, mode: str = MODES[0]) -> Iterator[Deployed]:
    directory = tempfile.mkdtemp(prefix="veil-bench-")
    processes: list[BrokerProcess] = []
    cluster: SparkCluster | None = None
    try:
        with contextlib.ExitStack() as stack:
            store = () if kind == "sqlite" else ("--store", stack.enter_context(postgres_database(postgres.url)))
            matchers = ("--partitions", str(partitions), "--partition-mode", mode)
            if kind in ("sqlite", "postgres"):
                broker = BrokerProcess(os.path.join(directory, "broker"), *store, *matchers).start()
                processes.append(broker)
                deployed = Deployed(broker, broker)
                deployed.components["gateway"] = lambda: cpu_seconds(broker.process.pid, descendants=False)
                deployed.components["pipeline"] = stack.enter_context(contextlib.closing(TreeCpu(broker.pipeline_pid)))
            else:
                flags: tuple[str, ...] = matchers
                if kind.startswith("cluster"):
                    cluster = SparkCluster(workers=int(kind[-2])).start()
                    flags = (*cluster.pipeline_flags(), "--driver-memory", "1g", *matchers)
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
                pipeline_cpu = TreeCpu(functools.partial(pid_of, pipeline))
                deployed.components["pipeline"] = stack.enter_context(contextlib.closing(pipeline_cpu))
                if cluster is not None:
                    workers = [
                        stack.enter_context(contextlib.closing(TreeCpu(functools.partial(running_pid, worker))))
                        for worker in cluster.workers if worker
                    ]  # fmt: skip
                    deployed.components["executors"] = lambda: sum(worker() for worker in workers)
            if store:
                deployed.components["postgres"] = lambda: cpu_seconds(postmaster(postgres))
                deployed.database = urllib.parse.urlsplit(store[1]).path.lstrip("/")
            yield deployed
            for process in processes:
                process.close()
    finally:
        for process in processes:
            process.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def measure(
    kind: str, postgres: PostgresServer, partitions: int, mode: str, counts: list[int], seconds: float, rate: float
) -> list[dict]:
    rows = []
    with deployment(kind, postgres, partitions, mode) as deployed:
        await run_case(deployed.publish, 8, 3, rate, 1, deployed.deliver)  # warm-up
        for n in counts:
            window = FlatOut(deployed, postgres)
            row = await run_case(
                deployed.publish, n, seconds, rate, 1, deployed.deliver, flat_out_window=window.measured
            )
            published = max(1, row["flat out published"])
            row.update(
                kind=kind, partitions=partitions, mode=mode,
                cpu={name: value / published for name, value in window.spent.items()},
                store=window.sampler.load.per_publication(published) if window.sampler else {},
            )  # fmt: skip
            rows.append(row)
            figures = {k: v for k, v in row["store"].items() if k != "top"}
            print(kind, partitions, mode, {k: v for k, v in row.items() if k not in ("cpu", "store")}, row["cpu"],
                  figures, flush=True)  # fmt: skip
    return rows


class FlatOut:
    """What each component spent, and what the store did, over a case's saturation phase alone: over
    the whole case, the subscriptions' setting up and removing (512 of them, each a few store writes)
    and the constant-rate phase were counted against the saturation phase's publications, and the
    write lock's time per publication, and the store ceiling from it, came out at half the rate the
    store had just held."""

    def __init__(self, deployed: Deployed, postgres: PostgresServer) -> None:
        self.deployed = deployed
        self.sampler = StoreSampler(postgres.url, deployed.database) if deployed.database else None
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def measured(self) -> Iterator[None]:
        before = {name: read() for name, read in self.deployed.components.items()}
        with self.sampler or contextlib.nullcontext():
            yield
        self.spent = {name: read() - before[name] for name, read in self.deployed.components.items()}
        if self.sampler:  # (what the sampler's own server process spent is the benchmark's, not the store's)
            self.spent["postgres"] -= self.sampler.load.sampler_cpu


# the columns that say which case a row is, in both tables
CASE: list[Column] = [
    ("deployment", 12, lambda r: r["kind"]),
    ("parts", 5, lambda r: r["partitions"]),
    ("mode", 5, lambda r: r["mode"][:4]),
    ("subs", 5, lambda r: r["subs"]),
]


def print_rows(rows: list[dict]) -> None:
    def us(component: str) -> Callable[[dict], object]:
        return lambda r: f"{r['cpu'][component] * 1e6:.0f}" if component in r["cpu"] else None

    def store(figure: str, digits: int) -> Callable[[dict], object]:
        return lambda r: f"{r['store'][figure]:.{digits}f}" if r["store"] else None

    print_table(
        f"SELIS lat/lon workload by deployment, one publication per POST; {os.cpu_count()} cores; "
        "CPU in µs per publication; store: statements sent, µs the log's and the feed's write locks were "
        "held, and µs waited for a lock, per publication",
        [
            *CASE,
            ("e2e pub/s", 10, lambda r: checked(r, "flat out", f"{r['sustained']:.0f}")),
            ("vs sqlite", 9, lambda r: f"{r['ratio']:.2f}" if r.get("ratio") else None),
            ("p50 ms", 7, lambda r: checked(r, "steady", f"{r['p50'] * 1000:.0f}")),
            ("p99 ms", 7, lambda r: checked(r, "steady", f"{r['p99'] * 1000:.0f}")),
            ("gateway", 8, us("gateway")),
            ("pipeline", 9, us("pipeline")),
            ("executors", 10, us("executors")),
            ("postgres", 9, us("postgres")),
            ("total", 7, lambda r: f"{sum(r['cpu'].values()) * 1e6:.0f}"),
            ("stmts", 6, store("statements", 1)),
            ("held", 6, store("held us", 0)),
            ("feed held", 9, store("feed held us", 0)),
            ("waited", 7, store("waited us", 0)),
            ("arrived at pub/s", 17, lambda r: arrived(r, "steady")),
            ("arrived flat out", 17, lambda r: arrived(r, "flat out")),
        ],
        rows,
    )


def print_scale_model(rows: list[dict]) -> None:
    """Cores per component at each rate of SCALE, from the CPU per publication above; the store's
    ceiling is the rate at which the busier of its write locks (held `held` and `feed held` µs per
    publication) is never free."""

    def cores(rate: int) -> Callable[[dict], object]:
        def shown(row: dict) -> str:
            components = ("gateway", "pipeline", "executors", "postgres")
            return "/".join(f"{rate * row['cpu'][c]:.0f}" for c in components if c in row["cpu"])

        return shown

    def ceiling(row: dict) -> str | None:
        held = max(row["store"].get("held us", 0), row["store"].get("feed held us", 0))
        return f"{1e6 / held:,.0f}" if held else None

    print_table(
        "Scale model (inputs: the table above): cores needed by component, gateway/pipeline[/executors]"
        "[/postgres], at each rate; one store's ceiling = 1 s / the busier write lock's held per publication",
        [
            *CASE,
            *((f"{rate:,} pub/s", 18, cores(rate)) for rate in SCALE),
            ("store ceiling pub/s", 20, ceiling),
        ],
        rows,
    )


async def main_async(args: argparse.Namespace) -> None:
    postgres = PostgresServer().start(**SETTINGS)
    rows: list[dict] = []
    try:
        for kind in args.only:
            for mode in args.modes:
                # a cluster's matcher partition runs all the time: one per core (worker) it has
                for partitions in [int(kind[-2])] if kind.startswith("cluster") else args.partitions:
                    rows += await measure(kind, postgres, partitions, mode, args.subscriptions, args.seconds, args.rate)
    finally:
        postgres.stop()
    baseline = {
        (r["subs"], r["partitions"], r["mode"]): r["sustained"]
        for r in rows
        if r["kind"] == "sqlite" and complete(r, "flat out")
    }
    for row in rows:
        same = (row["subs"], row["partitions"], row["mode"])
        if same in baseline and complete(row, "flat out"):
            row["ratio"] = row["sustained"] / baseline[same]
    print_rows(rows)
    print_scale_model(rows)
    busiest = max((r for r in rows if r["store"]), key=lambda r: r["store"]["statements"], default=None)
    if busiest is not None:
        print(f"\nStatements the server spent the most time in, per publication, in the case that sent the most "
              f"({busiest['kind']}, {busiest['partitions']} partitions, {busiest['subs']} subscriptions):")  # fmt: skip
        print("    calls       µs  statement")
        for calls, us, query in busiest["store"]["top"]:
            print(f"  {calls:7.2f}  {us:7.1f}  {query[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=subscription_counts, default=[1, 128, 512])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=200.0, help="publications/s in the latency phase")
    parser.add_argument("--only", type=lambda text: text.split(","), default=list(KINDS), help=", ".join(KINDS))
    parser.add_argument("--partitions", type=subscription_counts, default=[2], help="matcher partitions, e.g. 1,2,4")
    parser.add_argument("--modes", type=lambda text: text.split(","), default=[MODES[0]], help=", ".join(MODES))
    args = parser.parse_args()
    for option, chosen, known in (("--only", args.only, KINDS), ("--modes", args.modes, MODES)):
        if unknown := [name for name in chosen if name not in known]:
            parser.error(f"{option}: {', '.join(unknown)} unknown (known: {', '.join(known)})")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
