"""`veil serve --role pipeline`: the Spark driver runs in a process of its own session, and this one
passes it the stop. A shell's `kill %N`, or Ctrl-C, signals a whole process group; PySpark starts
its JVM (and the JVM its Python workers) in the driver's group, so the signal would stop them under
the driver, which then fails to stop its query. Apart, only the driver hears it, and it stops the
query and Spark in order (veil.pipeline.job). The gateway runs its pipeline the same way."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from typing import Any

import orjson

from veil.config import Config


def driver(alone: bool) -> list[str]:
    """The pipeline process's command line: it exits when this process is gone, and `--alone` (no
    gateway started it) waits for a gateway to create the store. Its settings go on stdin."""
    return [sys.executable, "-m", "veil.pipeline", str(os.getpid()), *(["--alone"] if alone else [])]


def settings(config: Config) -> bytes:
    """The pipeline's settings, for its stdin: a command line is anyone's to read on the machine, and
    they hold the store URL, password and all."""
    return orjson.dumps(dataclasses.asdict(config))


def run_apart(config: Config) -> int:
    """Run the pipeline until it ends or this process is told to stop; the pipeline's exit code (128
    plus the signal's number if a signal ended it)."""
    process: subprocess.Popen | None = None
    stopping: list[int] = []

    def stop(signum: int, _: Any) -> None:
        stopping.append(signum)
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(signum, stop)
    process = subprocess.Popen(driver(alone=True), stdin=subprocess.PIPE, start_new_session=True)
    if stopping:  # told before the driver existed: it stops as soon as it can hear it
        stop(stopping[0], None)
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a driver that died at once says why on stderr
        process.stdin.write(settings(config))
        process.stdin.close()
    code = process.wait()
    return 128 - code if code < 0 else code
