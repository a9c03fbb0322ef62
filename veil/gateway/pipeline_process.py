"""Supervision of the pipeline process: started with the gateway, restarted if it dies, stopped
gracefully (SIGTERM, then SIGKILL after a grace period) when the gateway stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from veil.config import Config
from veil.pipeline.session import driver, settings

log = logging.getLogger("veil.gateway")
RESTART_DELAY = 2.0
STOP_GRACE = 60.0


class PipelineProcess:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.process: asyncio.subprocess.Process | None = None
        self.exited: int | None = None  # the last exit code, while no pipeline process runs
        self.last_error = ""  # the last error line the pipeline logged, for /health
        self._stopping = False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def supervise(self) -> None:
        written = settings(self.config)
        while not self._stopping:
            # A new session: Ctrl-C in a terminal reaches the gateway only, which then stops the
            # pipeline in order instead of having the JVM killed under it.
            self.process = await asyncio.create_subprocess_exec(
                *driver(alone=False), start_new_session=True, stdin=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert self.process.stdin is not None
            self.process.stdin.write(written)
            self.process.stdin.close()
            self.exited = None
            assert self.process.stderr is not None  # started with stderr=PIPE
            relay = asyncio.create_task(self._relay(self.process.stderr))
            code = await self.process.wait()
            await relay
            self.exited = code
            if self._stopping:
                break
            log.error("pipeline process exited with %s; restarting in %.0f s", code, RESTART_DELAY)
            await asyncio.sleep(RESTART_DELAY)

    async def _relay(self, stream: asyncio.StreamReader) -> None:
        """The pipeline's log goes on to the gateway's stderr; its last error line is kept."""
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the buffer: pass on what is there
                line = await stream.read(1 << 16)
            if not line:
                return
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            if b" ERROR " in line or b"Error:" in line:
                self.last_error = line.decode(errors="replace").strip()[-300:]

    async def stop(self) -> None:
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE)
        except TimeoutError:
            log.warning("pipeline did not stop within %.0f s; killing it", STOP_GRACE)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
