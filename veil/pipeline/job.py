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
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from veil.config import Config
from veil.pipeline import class_archive
from veil.pipeline.partition_task import SILENT_MS, Silence
from veil.store import PipelineStore, StoreUnavailable
from veil.store.credentials import PASSWORD_ENV, without_password

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("veil.pipeline")
HEARTBEAT = 1.0  # seconds
STORE_RETRY = 2.0  # seconds between looks for a store that is not there yet
WARM_UP_ROUNDS = 3
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
    # the operator's own JVM options (--spark-conf) replace these, and they may not want an archive
    own_options = "spark.driver.extraJavaOptions" in config.spark_settings
    archive = class_archive.Plan() if own_options else class_archive.plan(config.class_cache_dir)
    java_options = shlex.join([f"-Dlog4j2.configurationFile=file:{log4j}", _FORK, *archive.options])
    builder = (
        SparkSession.builder.master(config.master)
        .appName("veil-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(config.partitions))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.minBatchesToRetain", "20")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_FILES)
        .config("spark.driver.memory", config.driver_memory)
    )
    if config.python_memory is not None:
        builder = builder.config("spark.executor.pyspark.memory", config.python_memory)
    if config.master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        # Spark's scratch space (block manager, broadcasts) beside the broker's data rather than in
        # /tmp: one place for an operator to secure, and where the privacy tests look
        builder = builder.config("spark.local.dir", os.path.join(os.path.abspath(config.data_dir), "spark-local"))
    _, password = without_password(config.store_url)
    if password is not None:
        # for libpq, here and in the local executors and Python workers, which inherit it; not as
        # spark.executorEnv, which PySpark would put on the JVM's command line: executors of other
        # machines take it from their own environment or ~/.pgpass
        os.environ[PASSWORD_ENV] = password
    for key, value in config.spark_settings.items():  # the operator's --spark-conf go last: they win
        builder = builder.config(key, value)
    # a speculative copy of a matcher task would run beside the original for the rest of the epoch,
    # the two fencing each other out of their partitions: not the operator's to turn on
    builder = builder.config("spark.speculation", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    jvm = spark.sparkContext._jvm  # PySpark's one way to the driver JVM's own properties
    assert jvm is not None  # a started context has its gateway
    class_archive.record(archive, jvm.System.getProperty("java.class.path"))
    return spark


def start_query(spark, config: Config):
    """The matching query of the configured trigger, checkpointed apart for each (their offsets differ)."""
    start = _rounds_query if config.trigger == "rounds" else _micro_batch_query
    return start(spark, config).option("checkpointLocation", f"{config.checkpoint_location}/{config.trigger}").start()


def _log_options(reader, config: Config):
    """What both triggers' sources read."""
    return (
        reader.option("store", without_password(config.store_url)[0])  # options show in plans: no password
        .option("partitions", str(config.partitions))
        .option("partitionMode", config.partition_mode)
        .option("authorization", "true" if config.with_authorization else "false")
        .option("entryTimeout", str(config.entry_timeout))
        .option("maxRowsPerRound", str(config.max_batch_rows))
        .option("maxMatchesPerRound", str(config.max_batch_matches))
    )


def _rounds_query(spark, config: Config):
    """Micro-batches that are epochs, each a long-running task per matcher partition (or per core,
    when the cores are fewer) that records its own rounds (`rounds`, `partition_task`); the sink
    only ends them."""
    from veil.pipeline.rounds import EventLogSource

    spark.dataSource.register(EventLogSource)
    epochs = (
        _log_options(spark.readStream.format(EventLogSource.name()), config)
        .option("epochSeconds", str(config.epoch_seconds))
        .option("roundGapMs", str(config.round_gap_ms))
        .option("slots", str(_slots(spark, config)))
        .load()
    )
    return epochs.writeStream.queryName("veil_match").foreachBatch(_epoch_ended)


def _slots(spark, config: Config) -> int:
    """How many tasks an epoch of `rounds` may run at once: local mode's task threads, which are
    known and fixed; on a cluster one per partition, since executors register after the query
    starts and come and go (a task that waits for a core has its partitions adopted meanwhile)."""
    return spark.sparkContext.defaultParallelism if config.master.startswith("local") else config.partitions


def _micro_batch_query(spark, config: Config):
    """Log ranges → mapInArrow (the matchers) → foreachBatch (the store records the rounds), one
    micro-batch per `--round-gap-ms` at most (`micro_batch`)."""
    from veil.pipeline.matcher import Matcher
    from veil.pipeline.micro_batch import ROUNDS_SCHEMA, LogRanges, MatchRanges, RecordRounds

    spark.dataSource.register(LogRanges)
    url = without_password(config.store_url)[0]
    matcher = Matcher(
        url, config.partitions, config.partition_mode == "publications", config.with_authorization,
        config.entry_timeout,
    )  # fmt: skip
    rounds = _log_options(spark.readStream.format(LogRanges.name()), config).load().mapInArrow(
        MatchRanges(matcher), ROUNDS_SCHEMA
    )
    return (
        rounds.writeStream.queryName("veil_match")
        .foreachBatch(RecordRounds(url, config.partitions))
        .trigger(processingTime=f"{max(config.round_gap_ms, 1)} milliseconds")
    )


_stopping = threading.Event()  # the query is being stopped: the epoch in progress is cut short


def _epoch_ended(frame: DataFrame, epoch: int) -> None:
    """Runs the epoch's tasks (a sink that looked at nothing would run none) and logs where they got."""
    try:
        ended = frame.collect()
    except Exception:
        if _stopping.is_set():  # the tasks were cancelled; what they recorded is in the store
            return
        raise
    where = ", ".join(f"partitions {row.parts or 'none'} at {row.processed} ({row.rounds} rounds)" for row in ended)
    log.debug("epoch %d: %s", epoch, where)


@contextlib.contextmanager
def _data_dir_lock(config: Config, stop: threading.Event) -> Iterator[bool]:
    """Hold the data directory's pipeline lock: True once held, False if told to stop while another
    pipeline held it."""
    os.makedirs(config.data_dir, exist_ok=True)
    fd = os.open(os.path.join(config.data_dir, "pipeline.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    log.info("waiting for the previous pipeline on %s to exit", config.data_dir)
                    waiting = True
                if stop.wait(0.2):
                    break
        yield not stop.is_set()
    finally:
        os.close(fd)


def _exit_with_parent(parent: int) -> None:
    """Exit when the process that started this one is gone (`parent`: its pid, as it said, so that
    one gone before this process looked is noticed too)."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                log.warning("the process that started the pipeline is gone; pipeline exits")
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Heartbeat:
    """What the gateway's health check reads: that this process is alive, the last sign of life of
    the matcher partition heard from least recently, and (with `tasks`, the rounds trigger) the
    partitions that have no running task, written every HEARTBEAT seconds.

    A partition has no running task when its sign of life has not changed for as long as the tasks
    wait before adopting it (SILENT_MS), timed by this process's clock as the tasks time it: its
    task's worker died or is stopped, or it waits for a core. The driver says so in its log when it
    starts and ends, and the gateway shows it in /health and its metrics."""

    def __init__(self, store: PipelineStore, partitions: int, tasks: bool) -> None:
        self.store = store
        self.partitions = partitions
        self.tasks = tasks
        self._silence = Silence()
        self._dark: set[int] = set()
        self._written: set[int] | None = None  # the dark partitions last written
        self._failing = False

    def beat(self) -> None:
        try:
            beats = self.store.partition_beats()
            quiet_since = min(beats.get(part, 0) for part in range(self.partitions))
            dark = self._darkness(beats) if self.tasks else set()
            # the dark partitions' rows are written when they change (the first time too), in a write
            # transaction; a heartbeat alone is one statement that waits for no lock
            changed = dark != self._written
            self.store.heartbeat(quiet_since, sorted(dark) if changed else None)
            self._written = dark
        except StoreUnavailable as exc:  # the gateway sees the silence; the matchers go on
            if not self._failing:
                log.error("cannot write the pipeline's heartbeat: %s", exc)
            self._failing = True
        else:
            self._failing = False

    def _darkness(self, beats: dict[int, int]) -> set[int]:
        silent = self._silence.hear(beats, range(self.partitions))
        dark = {part for part, seconds in silent.items() if seconds * 1000 > SILENT_MS}
        for part in sorted(dark - self._dark):
            log.warning("matcher partition %d has no running task (no sign of life for %.1f s)", part, silent[part])
        for part in sorted(self._dark - dark):
            log.info("matcher partition %d runs again", part)
        self._dark = dark
        return dark


class Executors:
    """Cuts the `rounds` trigger's epoch short when executors come or go: an epoch's tasks are
    placed when it starts, so a new executor would otherwise run none until the next epoch (up to
    --epoch-seconds later), and a lost one's retried task could wait for a core the epoch's
    running tasks hold until its deadline."""

    def __init__(self, spark, store: PipelineStore) -> None:
        self._tracker = spark.sparkContext._jsc.sc().statusTracker()  # Scala's, with the executors
        self._store = store
        self._known = self._executors()

    def _executors(self) -> set[str]:
        return {f"{info.host()}:{info.port()}" for info in self._tracker.getExecutorInfos()}

    def watch(self) -> None:
        now = self._executors()
        if now == self._known:
            return
        try:
            self._store.cut_epoch(lost=bool(self._known - now))
        except StoreUnavailable:  # tried again at the next heartbeat; the heartbeat says why
            return
        log.info(
            "executors changed (%s joined, %s left): the epoch ends now",
            ", ".join(sorted(now - self._known)) or "none", ", ".join(sorted(self._known - now)) or "none",
        )  # fmt: skip
        self._known = now


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


def _warm_up(store: PipelineStore, query: StreamingQuery, stop: threading.Event) -> None:
    """Let every matcher partition run a few rounds before saying the pipeline runs: the first
    starts Spark's Python workers, which import the matcher, open the store and build the
    partition's state; the next few still run slower while the JVM and the interpreter warm up.
    Seconds of work (the first ~8 s on two cores) that the first publications after /ready would
    otherwise wait for. Each round is made by a tick logged for it (the time), which every
    partition processes."""
    deadline = time.monotonic() + WARM_UP_TIMEOUT
    for _ in range(WARM_UP_ROUNDS):
        try:
            tick = store.append_tick()
        except StoreUnavailable:
            return
        while True:
            with contextlib.suppress(StoreUnavailable):
                if store.processed_offset() >= tick:  # the least of the partitions' progress
                    break
            if not query.isActive or time.monotonic() > deadline or stop.wait(0.02):
                return


def _stop_on_signals(stop: threading.Event) -> None:
    """Ctrl-C and SIGTERM end the loop below, which stops the query and Spark in order: an interrupt
    raised inside a py4j call would instead leave the JVM half stopped and print its tracebacks."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())


def run(config: Config, parent: int, patient: bool = False) -> int:
    """Run the query until stopped, or until the process that started this one (`parent`) is gone;
    `patient`: started on its own (`--role pipeline`), it waits for a gateway to create the store."""
    stop = threading.Event()
    _exit_with_parent(parent)
    _stop_on_signals(stop)
    with _data_dir_lock(config, stop) as locked:
        if not locked:
            return 0
        store = _open_store(config, stop, patient=patient)
        if store is None:
            return 2
        return _run_query(config, store, stop) if _claim(store, stop) else 0


def _run_query(config: Config, store: PipelineStore, stop: threading.Event) -> int:
    started = time.monotonic()
    # publication partitioning records every partition's rounds in turn, as one progress
    store.set_partitions(1 if config.partition_mode == "publications" else config.partitions)
    spark = build_session(config)
    _stop_on_signals(stop)  # SparkContext replaced SIGINT's handler with one that raises mid-call into the JVM
    query = start_query(spark, config)
    heartbeat = Heartbeat(store, config.partitions, tasks=config.trigger == "rounds")
    executors = Executors(spark, store) if config.trigger == "rounds" else None
    _warm_up(store, query, stop)
    if query.isActive:  # one that failed while warming up is reported below, not announced
        store.register_pipeline(os.getpid())
        log.info(
            "pipeline running (%s, %d partitions by %s, %s) after %.1f s",
            config.master, config.partitions, config.partition_mode, config.trigger, time.monotonic() - started,
        )  # fmt: skip
    try:
        while not stop.is_set():
            heartbeat.beat()
            if executors is not None:
                executors.watch()
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
        _stopping.set()
        query.stop()
        spark.stop()
        log.info("pipeline stopped")
