"""A Spark standalone cluster of separate JVMs started with `spark-class` (the pyspark package's):
one master and N workers on loopback. Each worker has a working directory and a HOME of its own, and
(under root) a mount namespace in which the `hidden` directories, such as the driver's data
directory, are empty and unreadable, as on a machine of its own: what its executors need they must
get over the network."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pyspark

from veil.harness.broker import free_ports

START_TIMEOUT = 60.0
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
PRIVATE_MOUNTS = ("unshare", "--mount", "--propagation", "private")
# mounts an empty, unreadable file system over each directory before `--`, then runs what follows
HIDE = 'while [ "$1" != -- ]; do mount -t tmpfs -o size=1m,mode=000 none "$1"; shift; done; shift; exec "$@"'


def spark_class() -> str:
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


class SparkCluster:
    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", hidden: tuple[str, ...] = ()) -> None:
        self.hidden = hidden
        self.directory = tempfile.mkdtemp(prefix="veil-spark-")
        os.chmod(self.directory, 0o755)
        self.port, self.ui_port, *self.worker_ui_ports = free_ports(2 + workers)
        self.cores, self.memory = cores, memory
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = [None] * workers

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def pipeline_flags(self) -> tuple[str, ...]:
        """`veil serve` flags for a pipeline on this cluster: its driver on loopback, where the
        executors reach it."""
        return (
            "--spark-master", self.url,
            "--spark-conf", "spark.driver.host=127.0.0.1", "--spark-conf", "spark.driver.bindAddress=127.0.0.1",
        )  # fmt: skip

    def start(self) -> SparkCluster:
        self.master = self._launch(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        self._wait(lambda: self._status().get("status") == "ALIVE", "the master")
        for index in range(len(self.workers)):
            self.start_worker(index)
        self._wait(lambda: self._alive_workers() == len(self.workers), f"{len(self.workers)} workers")
        return self

    def start_worker(self, index: int) -> None:
        name = f"worker-{index}"
        self.workers[index] = self._launch(
            name, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
            "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(self.worker_ui_ports[index]),
            "--work-dir", os.path.join(self.directory, name, "work"),
        )  # fmt: skip

    def kill_worker(self, index: int | None = None, timeout: float = START_TIMEOUT) -> list[int]:
        """kill -9 a worker's JVM while it runs an executor of an application the master runs: killing
        one that runs none would lose nothing, and a test of surviving the loss would pass untested.
        Waits up to `timeout` for worker `index` (any worker if None) to run one, and raises
        otherwise; then waits for the executors to notice and exit on their own, as they must for
        the application to have lost them. Returns the executors' process ids."""
        candidates = range(len(self.workers)) if index is None else [index]
        deadline = time.monotonic() + timeout
        while not (busy := [(i, pids) for i in candidates if (pids := self.executor_pids(i))]):
            if time.monotonic() > deadline:
                where = "any worker" if index is None else f"worker {index}"
                raise AssertionError(f"no executor of a running application on {where}: {self._status()}")
            time.sleep(0.25)
        index, pids = busy[0]
        worker = self.workers[index]
        assert worker is not None
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + timeout
        while alive := [pid for pid in pids if process_running(pid)]:
            if time.monotonic() > deadline:
                raise AssertionError(f"executors {alive} outlived their worker by {timeout} s")
            time.sleep(0.25)
        return pids

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs worker `index` runs for an application the master lists as running: its
        children running CoarseGrainedExecutorBackend with such an `--app-id`, the processes a kill
        of the worker takes down."""
        worker = self.workers[index]
        if worker is None or worker.poll() is not None:
            return []
        running = {app["id"] for app in self._status().get("activeapps", []) if app.get("state") == "RUNNING"}
        pids = []
        for pid in children(worker.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = handle.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            options = dict(itertools.pairwise(argv))
            if EXECUTOR in argv and options.get("--app-id") in running:
                pids.append(pid)
        return pids

    def _launch(self, name: str, main: str, *args: str) -> subprocess.Popen:
        home = os.path.join(self.directory, name)
        os.makedirs(os.path.join(home, "work"), exist_ok=True)
        environment = {
            **os.environ, "HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": home,
            "SPARK_WORKER_DIR": os.path.join(home, "work"), "SPARK_NO_DAEMONIZE": "1",
        }  # fmt: skip
        environment.pop("SPARK_HOME", None)
        command = [spark_class(), main, *args]
        if self.hidden and os.geteuid() == 0:
            command = [*PRIVATE_MOUNTS, "sh", "-c", HIDE, "sh", *self.hidden, "--", *command]
        log = open(os.path.join(self.directory, f"{name}.log"), "ab")  # noqa: SIM115 - handed to the child
        process = subprocess.Popen(command, cwd=home, env=environment, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return process

    def _status(self) -> dict:
        import json

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as response:
                return json.loads(response.read())
        except OSError:
            return {}

    def _alive_workers(self) -> int:
        return sum(worker.get("state") == "ALIVE" for worker in self._status().get("workers", []))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"{what} not up after {START_TIMEOUT} s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        out = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".log"):
                with open(os.path.join(self.directory, name), errors="replace") as handle:
                    out.append(f"--- {name}\n" + "".join(handle.readlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in [*self.workers, self.master]:
            if process is not None:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def children(pid: int) -> list[int]:
    """The child processes of `pid`, whichever of its threads started them (a JVM starts processes
    from threads other than its main one)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def process_running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited: an orphan that exited stays a zombie until
    whoever adopted it reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
