"""README.md's command blocks run in order, as written, against the brokers they start (see
tests/readme.py for the marks). Only the ports are the walk's own: 20000, 20001 and 20002 in a
block (and VEIL_PORT, VEIL_URL for commands that name none) become three free ports."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.readme import ROOT, Block, blocks

pytestmark = pytest.mark.slow
WAIT = 3.0  # seconds after a command sent to the background, before the block's next line
READY = 180.0  # seconds a broker may take to be ready (Spark's start on a loaded machine)
BLOCK_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0
LINKED = (".venv", "examples", "bench", "deploy")
BACKGROUND = re.compile(r"(?<![&|])&\s*(#[^'\"]*)?$")  # a command sent to the background, perhaps with a comment


def _free_ports() -> int:
    """A base port with the next two free as well."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + 2 < 65536 and all(_free(base + i) for i in range(3)):
            return base
    raise RuntimeError("no three consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Walk:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = _free_ports()
        # the README's commands as a newcomer runs them: none of the reader's own settings
        self.env = {name: value for name, value in os.environ.items() if not name.startswith("VEIL_")}
        self.env.update(VEIL_PORT=str(self.port), VEIL_URL=f"http://127.0.0.1:{self.port}")
        self.broker: subprocess.Popen | None = None
        self.broker_log: Path | None = None
        venv = Path(sys.executable).parent.parent  # the venv the suite runs in, as the README's .venv
        for name in LINKED:
            target = venv if name == ".venv" else ROOT / name
            (directory / name).symlink_to(target)

    def ported(self, text: str) -> str:
        return re.sub(r"\b2000([012])\b", lambda m: str(self.port + int(m.group(1))), text)

    def serve(self, block: Block) -> None:
        self.stop()
        self.broker_log = self.directory / f"broker-{block.line}.log"
        with open(self.broker_log, "wb") as log:
            self.broker = subprocess.Popen(
                ["bash", "-c", self.ported(block.text)], cwd=self.directory, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        tls = "--certificate" in block.text
        url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/ready"
        context = ssl._create_unverified_context() if tls else None  # readiness only: the blocks verify
        deadline = time.monotonic() + READY
        while time.monotonic() < deadline:
            assert self.broker.poll() is None, f"README.md:{block.line}: the broker ended\n{self.broker_log.read_text()}"
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"README.md:{block.line}: not ready in {READY} s\n{self.broker_log.read_text()}")

    def stop(self) -> None:
        """Ctrl-C, as a terminal sends it to the broker's process group: it stops in order, and quietly."""
        if self.broker is None:
            return
        os.killpg(self.broker.pid, signal.SIGINT)
        code = self.broker.wait(STOP_TIMEOUT)
        assert self.broker_log is not None
        log = self.broker_log.read_text()
        self.broker = None
        assert code == 0 and "Traceback" not in log and "stopped" in log, f"exit {code}\n{log}"

    def run(self, block: Block) -> tuple[str, str]:
        """Run the block; what it printed on stdout and stderr."""
        script = ["set -euo pipefail", "jobs=()"]
        for line in self._commands(self.ported(block.text)):
            script.append(line)
            if BACKGROUND.search(line):
                script += ["jobs+=($!)", f"sleep {WAIT}"]
        script.append('for job in "${jobs[@]}"; do wait "$job"; done')  # each job's exit code counts
        until = block.option("until")
        process = subprocess.Popen(
            ["bash", "-c", "\n".join(script)], cwd=self.directory, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            if until:
                time.sleep(float(until[0]))
                assert process.poll() is None, f"README.md:{block.line}: ended before it was stopped"
                os.killpg(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise AssertionError(f"README.md:{block.line}: still running after {BLOCK_TIMEOUT} s\n{out}\n{err}") from None
        where = f"README.md:{block.line}: exit {process.returncode}\nstdout:\n{out}\nstderr:\n{err}"
        assert process.returncode == (130 if until else 0), where
        assert "Traceback" not in err, where
        for expected in set(block.option("expect")):
            times = block.option("expect").count(expected)
            assert out.count(expected) >= times, f"{expected!r} not printed {times} times\n{where}"
        for expected in block.option("expect-stderr"):
            assert expected in err, f"{expected!r} not said\n{where}"
        for count in block.option("lines"):
            assert len(out.splitlines()) == int(count), f"not {count} lines printed\n{where}"
        for expected in block.option("once"):
            assert (out + err).count(expected) == 1, f"{expected!r} not said once\n{where}"
        return out, err

    @staticmethod
    def _commands(text: str) -> list[str]:
        """The block's lines, a command continued with a backslash joined into one."""
        joined: list[str] = []
        for line in text.splitlines():
            if joined and joined[-1].endswith("\\"):
                joined[-1] += "\n" + line
            else:
                joined.append(line)
        return joined


def test_every_runnable_block_runs_as_written(tmp_path):
    walk = Walk(tmp_path)
    runnable = [b for b in blocks()[0] if b.kind in ("serve", "run", "file")]
    assert {b.kind for b in runnable} == {"serve", "run", "file"}
    try:
        for block in runnable:
            if block.kind == "file":
                assert block.name, f"README.md:{block.line}: a file block names its file"
                (tmp_path / block.name).write_text(block.text)
            elif block.kind == "serve":
                walk.serve(block)
            else:
                walk.run(block)
        walk.stop()
    finally:
        if walk.broker is not None:
            os.killpg(walk.broker.pid, signal.SIGKILL)
            walk.broker.wait()
