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


def run_apart(config: Config) -> int:
    """Run the pipeline until it ends or this process is told to stop; the pipeline's exit code (128
    plus the signal's number if a signal ended it). Its settings go on stdin: a command line is
    anyone's to read, and they hold the store URL."""
    driver: subprocess.Popen | None = None
    stopping: list[int] = []

    def stop(signum: int, _: Any) -> None:
        stopping.append(signum)
        if driver is not None:
            with contextlib.suppress(ProcessLookupError):
                driver.send_signal(signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(signum, stop)
    driver = subprocess.Popen(
        [sys.executable, "-m", "veil.pipeline", str(os.getpid()), "--alone"], stdin=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    if stopping:  # told before the driver existed: it stops as soon as it can hear it
        stop(stopping[0], None)
    assert driver.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a driver that died at once says why on stderr
        driver.stdin.write(orjson.dumps(dataclasses.asdict(config)))
        driver.stdin.close()
    code = driver.wait()
    return 128 - code if code < 0 else code
