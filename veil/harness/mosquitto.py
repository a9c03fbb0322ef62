"""A Mosquitto MQTT broker of its own, in a temporary directory on a free loopback port (the
`mosquitto` binary from the PATH or Debian's /usr/sbin): messages queued for an offline persistent
session are kept without limit, so that a test or benchmark sees the bridge's losses, not the
MQTT broker's queue limits."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

from veil.harness.broker import free_ports

START_TIMEOUT = 20.0


def binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )


class MosquittoServer:
    def __init__(self) -> None:
        found = binary()
        if found is None:
            raise FileNotFoundError("Mosquitto is not installed (Debian: apt-get install mosquitto)")
        self.binary = found
        self.directory = tempfile.mkdtemp(prefix="veil-mosquitto-")
        (self.port,) = free_ports(1)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> MosquittoServer:
        config = os.path.join(self.directory, "mosquitto.conf")
        with open(config, "w") as handle:
            handle.write(
                f"listener {self.port} 127.0.0.1\n"
                "allow_anonymous true\n"
                "max_queued_messages 0\n"  # no limit on what waits for an offline session
                "max_inflight_messages 20\n"
                "persistence false\n"
            )
        log = open(os.path.join(self.directory, "mosquitto.log"), "wb")  # noqa: SIM115  # the child's, closed with it
        self.process = subprocess.Popen([self.binary, "-c", config], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"mosquitto did not listen on {self.port}: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(os.path.join(self.directory, "mosquitto.log"), errors="replace") as handle:
                return handle.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)
