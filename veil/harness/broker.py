"""A broker (gateway + Spark pipeline) as a child process on free loopback ports, for the integration
tests and the benchmarks."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

READY_TIMEOUT = 180.0
OPEN_REGISTRY: dict[str, Any] = {"rules": {"*": [[]]}, "announce": {"*": [[]]}}
_children: list[subprocess.Popen] = []  # every broker started here, killed at exit if still running


@atexit.register
def _kill_leftovers() -> None:
    """A broker whose test or benchmark ended without stopping it (an error in between, a stop that
    timed out) would otherwise run on, restarting its pipeline against a store that is gone, and
    take the CPU of whatever runs next."""
    for child in _children:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class BrokerProcess:
    def __init__(
        self, data_dir: str, *extra: str, ca_file: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.env = env
        self.port, self.tcp_port, self.ws_port = free_ports(3)
        self.extra = list(extra)
        self.ca_file = ca_file
        self.scheme = "https" if "--certificate" in extra else "http"
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, "broker.log")

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> BrokerProcess:
        os.makedirs(self.data_dir, exist_ok=True)
        command = [
            sys.executable, "-m", "veil.cli", "serve", "--data-dir", self.data_dir, "--port", str(self.port),
            "--tcp-port", str(self.tcp_port), "--ws-port", str(self.ws_port), "--hostname", "localhost",
            *self._development_defaults(), *self.extra,
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        environment = None if self.env is None else {**os.environ, **self.env}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        _children[:] = [child for child in _children if child.poll() is None] + [self.process]
        log.close()
        if wait_ready:
            self.wait_ready()
        return self

    def _development_defaults(self) -> list[str]:
        """Unless told otherwise: any claimed authHash is an identity, clients without one are
        anonymous, every subscriber may receive everything and every client may announce (a registry
        whose only rules are the empty ones for anyone), so that tests and benchmarks about other
        things need no registry."""
        defaults = []
        if "--auth" not in self.extra:
            defaults += ["--auth", "certificate,token,any-hash"]
        if "--anonymous" not in self.extra:
            defaults += ["--anonymous", "true"]
        if "--registry" not in self.extra:
            path = os.path.join(self.data_dir, "open-registry.json")
            with open(path, "w") as handle:
                json.dump(OPEN_REGISTRY, handle)
            defaults += ["--registry", path]
        return defaults

    def health(self) -> dict:
        import ssl

        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        with urllib.request.urlopen(f"{self.url}/health", timeout=5, context=context) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        """The broker's /metrics, by sample name with its labels (`name{label="value"}`)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return {
            sample.name + "".join(f'{{{k}="{v}"}}' for k, v in sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if self.health()["pipeline"] == "running":
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"broker not ready after {timeout} s:\n{self.tail()}")

    def wait_processed(self, timeout: float = 60.0) -> float:
        """Until the pipeline has matched everything in the log; returns the time it got there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.health()
            if state["processed"] >= state["head"]:
                return time.time()
            time.sleep(0.05)
        raise TimeoutError(f"pipeline still behind: {self.health()}")

    def stop(self, timeout: float = 90.0, signum: int = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        code = self.process.wait(timeout)
        self._wait_pipeline_gone()
        return code

    def pipeline_pid(self) -> int | None:
        """The pipeline process the broker supervises (its child running `veil.pipeline`)."""
        assert self.process is not None
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as handle:
                children = [int(pid) for pid in handle.read().split()]
        except OSError:
            return None
        for pid in children:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    if b"veil.pipeline" in handle.read():
                        return pid
            except OSError:
                continue
        return None

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def _wait_pipeline_gone(self, timeout: float = 60.0) -> None:
        lock = os.path.join(self.data_dir, "pipeline.lock")
        if not os.path.exists(lock):
            return
        import fcntl

        deadline = time.monotonic() + timeout
        with open(lock, "a") as handle:
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    return
                except BlockingIOError:
                    time.sleep(0.2)

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.stop(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
