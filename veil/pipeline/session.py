"""`veil serve --role pipeline`: the Spark driver runs in a process of its own session, and this one
passes it the stop. A shell's `kill %N`, or Ctrl-C, signals a whole process group; PySpark starts
its JVM (and the JVM its Python workers) in the driver's group, so the signal would stop them under
the driver, which then fails to stop its query. Apart, only the driver hears it, and it stops the
query and Spark in order (veil.pipeline.job). The gateway runs its pipeline the same way."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
from typing import Any

import orjson

from veil.config import Config


def run_apart(config: Config) -> int:
    """Run the pipeline until it ends or this process is told to stop; the pipeline's exit code.
    Its settings go on stdin: a command line is anyone's to read, and they hold the store URL."""
    driver = subprocess.Popen(
        [sys.executable, "-m", "veil.pipeline", "--alone"], stdin=subprocess.PIPE, start_new_session=True
    )
    assert driver.stdin is not None
    driver.stdin.write(orjson.dumps(dataclasses.asdict(config)))
    driver.stdin.close()

    def stop(*_: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            driver.send_signal(signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    return driver.wait()
