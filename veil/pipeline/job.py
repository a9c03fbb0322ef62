"""The pipeline process: one Spark driver running the matching query until it is told to stop.

It runs apart from the gateway (they meet only in the store) so that the driver's Python work does
not compete with the gateway's event loop, and either can be restarted alone. An exclusive lock on
the data directory keeps two drivers from sharing one checkpoint; the driver exits when its parent
gateway dies, so a killed broker never leaves a matcher behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from veil.config import Config
from veil.store import PipelineStore, StoreUnavailable

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from veil.pipeline.batch_times import BatchTimes

log = logging.getLogger("veil.pipeline")
HEARTBEAT = 0.5  # seconds
WAIT_MARGIN_MS = 10  # the source waits for a commit this much less than a trigger interval
STORE_RETRY = 2.0  # seconds between looks for a store that is not there yet
WARM_UP_BATCHES = 3
WARM_UP_TIMEOUT = 120.0  # seconds warming up may take before the pipeline says it runs anyway


# Without Hadoop's native library (pip's pyspark has none), its local file system runs `chmod` for
# every file it creates and FileContext's rename runs `readlink`: processes forked from the driver's
# JVM, two to four per checkpoint file, two checkpoint files per micro-batch, together ~60-150 ms of
# every batch on two cores. The FileSystem-based manager renames in Java (still atomic on a local
# disk: rename(2)); vfork is the cheapest way for the JVM to start the chmod that remains.
_CHECKPOINT_FILES = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
_FORK = "-Djdk.lang.Process.launchMechanism=VFORK"


def build_session(config: Config):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if config.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    log4j = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    builder = (
        SparkSession.builder.master(config.master)
        .appName("veil-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(config.partitions))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.minBatchesToRetain", "20")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j} {_FORK}")
        .config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_FILES)
        .config("spark.driver.memory", config.driver_memory)
    )
    if config.master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        # Spark's scratch space (block manager, broadcasts) beside the broker's data rather than in
        # /tmp: one place for an operator to secure, and where the privacy tests look
        builder = builder.config("spark.local.dir", os.path.join(os.path.abspath(config.data_dir), "spark-local"))
    for key, value in config.spark_settings.items():  # the operator's --spark-conf go last: they win
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def start_query(spark, config: Config):
    from veil.pipeline.exit_point import DeliveryWriter
    from veil.pipeline.match import MatchPartition
    from veil.pipeline.rows import MATCH_SCHEMA
    from veil.pipeline.source import EventLogSource

    spark.dataSource.register(EventLogSource)
    url = config.store_url
    log_entries = (
        spark.readStream.format(EventLogSource.name())
        .option("store", url)
        .option("partitions", str(config.partitions))
        .option("maxRowsPerBatch", str(config.max_batch_rows))
        .option("maxMatchesPerBatch", str(config.max_batch_matches))
        .option("partitionMode", config.partition_mode)
        .option("waitMs", str(max(0, config.trigger_ms - WAIT_MARGIN_MS)))
        .load()
    )
    by_publication = config.partition_mode == "publications"
    task = MatchPartition(url, config.partitions, by_publication, config.with_authorization, config.entry_timeout)
    matches = log_entries.mapInArrow(task, MATCH_SCHEMA)
    return (
        matches.writeStream.queryName("veil_match")
        .foreachBatch(DeliveryWriter(url))
        .option("checkpointLocation", config.checkpoint_location)
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
        .start()
    )


def _lock_data_dir(config: Config) -> int:
    os.makedirs(config.data_dir, exist_ok=True)
    fd = os.open(os.path.join(config.data_dir, "pipeline.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("waiting for the previous pipeline on %s to exit", config.data_dir)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _exit_with_parent(stop: threading.Event) -> None:
    parent = os.getppid()

    def watch() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent:
                log.warning("gateway process is gone; pipeline exits")
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Heartbeat:
    """What the gateway's health check reads: that this process is alive, and since when the current
    micro-batch runs (0 when none does), written every HEARTBEAT seconds with the durations of the
    batches finished since the last beat."""

    def __init__(self, store: PipelineStore, batch_times: BatchTimes) -> None:
        self.store = store
        self.batch_times = batch_times
        self.batch_since = 0
        self._failing = False

    def beat(self, query: StreamingQuery) -> None:
        active = bool(query.status.get("isTriggerActive"))
        if not active:
            self.batch_since = 0
        elif not self.batch_since:
            self.batch_since = time.time_ns() // 1_000_000
        finished = self.batch_times.drain()
        try:
            self.store.heartbeat(self.batch_since, finished)
        except StoreUnavailable as exc:  # the gateway sees the silence; the query goes on
            self.batch_times.restore(finished)
            if not self._failing:
                log.error("cannot write the pipeline's heartbeat: %s", exc)
            self._failing = True
        else:
            self._failing = False


def _open_store(config: Config, stop: threading.Event, patient: bool) -> PipelineStore | None:
    """The gateway's store; a pipeline started on its own (`--role pipeline`) waits for a gateway to
    create it, since a deployment may start its parts in any order."""
    from veil.store import StoreMissing, StoreUnavailable, open_store

    reported = ""
    while True:
        try:
            return open_store(config.store_url, create=False)
        except (StoreMissing, StoreUnavailable) as exc:
            if not patient:
                log.error("pipeline cannot start: %s", exc)
                return None
            if str(exc) != reported:
                log.warning("pipeline waits for its store: %s", exc)
                reported = str(exc)
        if stop.wait(STORE_RETRY):
            return None


def _claim(store: PipelineStore, stop: threading.Event) -> bool:
    """Wait until this is the store's one pipeline (a second one started on the same store is a
    standby that takes over when the first ends); False if told to stop meanwhile."""
    waiting = False
    while not stop.is_set():
        try:
            if store.claim_pipeline():
                return True
            if not waiting:
                log.warning("another pipeline runs on this store: this one waits to take over")
                waiting = True
        except StoreUnavailable as exc:
            log.warning("cannot reach the store: %s", exc)
        stop.wait(STORE_RETRY)
    return False


def _still_claimed(store: PipelineStore) -> bool:
    try:
        return store.claim_pipeline()
    except StoreUnavailable:
        return False


def _warm_up(store: PipelineStore, query: StreamingQuery, batch_times: BatchTimes, stop: threading.Event) -> None:
    """Run a few micro-batches before saying the pipeline runs: the first starts Spark's Python
    workers, which import the matcher and open the store, and plans the query; the next few still
    run slower while the JVM compiles the code they take. Seconds of work (the first ~8 s on two
    cores) that the first publications after /ready would otherwise wait for. A backlog makes the
    batches; with nothing to do, the pipeline logs a tick (the time) for each."""
    deadline = time.monotonic() + WARM_UP_TIMEOUT
    while batch_times.finished < WARM_UP_BATCHES:
        with contextlib.suppress(StoreUnavailable):
            if store.head_offset() <= store.processed_offset():
                store.append_tick()
        if not query.isActive or time.monotonic() > deadline or stop.wait(0.02):
            return


def run(config: Config, watch_parent: bool = True) -> int:
    """Run the query until stopped; `watch_parent`: the gateway started this process (`--role all`)."""
    stop = threading.Event()
    if watch_parent:
        _exit_with_parent(stop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    lock = _lock_data_dir(config)
    store = _open_store(config, stop, patient=not watch_parent)
    if store is None:
        return 2
    if not _claim(store, stop):
        return 0
    started = time.monotonic()
    from veil.pipeline.batch_times import BatchTimes

    spark = build_session(config)
    batch_times = BatchTimes()
    spark.streams.addListener(batch_times)
    query = start_query(spark, config)
    heartbeat = Heartbeat(store, batch_times)
    _warm_up(store, query, batch_times, stop)
    store.register_pipeline(os.getpid())
    log.info(
        "pipeline running (%s, %d partitions by %s) after %.1f s",
        config.master, config.partitions, config.partition_mode, time.monotonic() - started,
    )  # fmt: skip
    try:
        while not stop.is_set():
            heartbeat.beat(query)
            if not _still_claimed(store):
                log.error("this pipeline lost its claim on the store (its connection to it broke); it stops")
                return 1
            if query.awaitTermination(HEARTBEAT):
                break
        if query.exception() is not None:
            log.error("matching query failed: %s", query.exception())
            return 1
        return 0
    finally:
        with contextlib.suppress(StoreUnavailable):
            store.register_pipeline(0)
        query.stop()
        spark.stop()
        os.close(lock)
