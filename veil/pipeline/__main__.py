"""Entry point of the pipeline process, started by the gateway or by `veil serve --role pipeline`:
`python -m veil.pipeline PARENT_PID [--alone]`, with its settings (the Config as JSON) on stdin; it
exits when PARENT_PID is gone, and `--alone` (no gateway started it) waits for a gateway to create
the store."""

from __future__ import annotations

import logging
import sys

import orjson

from veil.config import Config
from veil.pipeline.job import run


def main() -> int:
    config = Config(**orjson.loads(sys.stdin.buffer.read()))
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return run(config, int(sys.argv[1]), patient="--alone" in sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
