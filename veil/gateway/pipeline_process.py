"""Supervision of the pipeline process: started with the gateway, restarted if it dies, stopped
gracefully (SIGTERM, then SIGKILL after a grace period) when the gateway stops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys

import orjson

from veil.config import Config

log = logging.getLogger("veil.gateway")
RESTART_DELAY = 2.0
STOP_GRACE = 60.0


class PipelineProcess:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.process: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def supervise(self) -> None:
        settings = orjson.dumps(dataclasses.asdict(self.config))
        while not self._stopping:
            # A new session: Ctrl-C in a terminal reaches the gateway only, which then stops the
            # pipeline in order instead of having the JVM killed under it.
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "veil.pipeline", settings, start_new_session=True
            )
            code = await self.process.wait()
            if self._stopping:
                break
            log.error("pipeline process exited with %s; restarting in %.0f s", code, RESTART_DELAY)
            await asyncio.sleep(RESTART_DELAY)

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
