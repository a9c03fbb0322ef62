"""Entry point of the pipeline process, started by the gateway or by `veil serve --role pipeline`
(`--alone`: no gateway created the store, so it waits for one to): `python -m veil.pipeline`, with
its settings (the Config as JSON) on stdin."""

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
    return run(config, patient="--alone" in sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
