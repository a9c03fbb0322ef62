"""The floor Spark itself sets on a micro-batch pipeline: the least one shaped like a matcher takes.

A rate-like Python data source (offsets are row numbers, due at a constant rate from the start; a
row's time is when it was due) → mapInArrow that passes rows through → foreachBatch that collects
them to the driver. Same Spark settings as the broker's pipeline (`build_session`), a trigger,
same partitions. Latency is from a row being due (readable by the source) to its foreachBatch
having returned; Spark's own split of each micro-batch (`durationMs`) is reported beside it.

`--stateful K` puts Spark's own keyed state in the middle instead of the pass-through: rows grouped
by K keys (as top-k/w windows are by subscription) into `transformWithStateInPandas`, each key
keeping a count and a processing-time timer (a window's expiry) in the RocksDB state store. What
that adds to each batch is what the `micro-batch` trigger would pay to keep top-k/w state in Spark
instead of in the store it records its rounds in.

    python -m bench.spark_floor [--rate 1000] [--seconds 20] [--trigger-ms 50] [--partitions 2]
                                [--stateful K]

Prints one JSON document (what `bench.latency` reads when it runs this in the same run).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

from veil.config import Config
from veil.pipeline.job import build_session


class _Rows(InputPartition):
    def __init__(self, low: int, high: int) -> None:
        super().__init__((low, high))
        self.low, self.high = low, high


class DueRows(DataSource):
    """Row n is due at `start + n / rate` seconds."""

    @classmethod
    def name(cls) -> str:
        return "veil_floor_rows"

    def schema(self) -> str:
        return "n LONG, due DOUBLE"

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return _DueReader(self.options)


class _DueReader(DataSourceStreamReader):
    def __init__(self, options: dict) -> None:
        self.rate = float(options["rate"])
        self.start = float(options["start"])
        self.parts = int(options["partitions"])

    def initialOffset(self) -> dict:
        return {"n": 0}

    def latestOffset(self) -> dict:
        return {"n": max(0, int((time.time() - self.start) * self.rate))}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        low, high = start["n"], end["n"]
        cuts = [low + (high - low) * p // self.parts for p in range(self.parts + 1)]
        return [_Rows(cuts[p], cuts[p + 1]) for p in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Rows)
        n = np.arange(partition.low, partition.high, dtype=np.int64)
        yield pa.RecordBatch.from_arrays([pa.array(n), pa.array(self.start + n / self.rate)], names=["n", "due"])


def _passed_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


class _Window(StatefulProcessor):
    """Per key: how many rows it saw, and a timer a minute on (re-armed by each batch with rows)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count LONG")

    def handleInputRows(self, key, rows, timerValues: TimerValues):
        seen = self.count.get()[0] if self.count.exists() else 0
        for frame in rows:
            seen += len(frame)
            yield frame[["n", "due"]]
        self.count.update((seen,))
        for due in self.handle.listTimers():
            self.handle.deleteTimer(due)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 60_000)


class _Collect:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.measuring = False

    def __call__(self, frame, batch_id: int) -> None:
        due = frame.toArrow().column("due").to_numpy()
        if self.measuring:
            self.latencies.extend((time.time() - due).tolist())


def measure(
    rate: float, seconds: float, trigger_ms: int, partitions: int, fused: bool = False, warmup: float = 10.0,
    stateful: int = 0,
) -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="veil-floor-") as data_dir:
        config = Config(data_dir=data_dir, partitions=partitions)
        spark = build_session(config)
        if stateful:  # transformWithState keeps its state only in RocksDB
            spark.conf.set(
                "spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            )
        spark.dataSource.register(DueRows)
        rows = (
            spark.readStream.format(DueRows.name())
            .option("rate", str(rate))
            .option("start", str(time.time()))
            .option("partitions", str(partitions))
            .load()
        )
        collect = _Collect()
        if stateful:
            stage = (
                rows.withColumn("key", rows.n % stateful)
                .groupBy("key")
                .transformWithStateInPandas(_Window(), "n LONG, due DOUBLE", "Update", "ProcessingTime")
            )
        elif fused:
            stage = rows
        else:
            stage = rows.mapInArrow(_passed_through, rows.schema)
        query = (
            stage.writeStream.foreachBatch(collect)
            .option("checkpointLocation", config.checkpoint_location)
            .trigger(processingTime=f"{trigger_ms} milliseconds")
            .start()
        )
        phases: dict[str, list[int]] = collections.defaultdict(list)
        seen: set[int] = set()
        time.sleep(warmup)
        while len(query.recentProgress) < 3:  # past the first batches (Python workers, a cold JVM)
            time.sleep(0.5)
        collect.measuring = True
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for progress in query.recentProgress:
                if progress.batchId not in seen and progress.numInputRows:
                    seen.add(progress.batchId)
                    for phase, ms in progress.durationMs.items():
                        phases[phase].append(ms)
            threading.Event().wait(0.5)
        collect.measuring = False
        query.stop()
        spark.stop()
    latencies = np.array(collect.latencies)
    return {
        "rate": rate,
        "stateful": stateful,
        "batches": len(seen),
        "p50": float(np.percentile(latencies, 50)),
        "p99": float(np.percentile(latencies, 99)),
        "phases": {phase: statistics.median(values) for phase, values in sorted(phases.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--trigger-ms", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=Config.partitions)
    parser.add_argument("--fused", action="store_true", help="no mapInArrow: the source's tasks do the work")
    parser.add_argument("--stateful", type=int, default=0, help="keyed state in Spark over this many keys")
    args = parser.parse_args()
    figures = measure(args.rate, args.seconds, args.trigger_ms, args.partitions, args.fused, stateful=args.stateful)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
