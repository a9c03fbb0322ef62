"""The broker a benchmark measures: a fresh data directory, started and removed around one run."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator

from veil.harness import BrokerProcess


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep", action="store_true", help="keep the broker's data directory and log")
    parser.add_argument("--broker-args", nargs=argparse.REMAINDER, default=[], help="extra `veil serve` flags")


def add_trigger_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--triggers", type=lambda text: text.split(","), default=["rounds", "micro-batch"],
        help="the pipeline's triggers to measure, one broker each, side by side (veil serve --trigger)",
    )  # fmt: skip


def subscription_counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


@contextlib.contextmanager
def benched_broker(*serve_args: str, keep: bool = False, env: dict[str, str] | None = None) -> Iterator[BrokerProcess]:
    data_dir = tempfile.mkdtemp(prefix="veil-bench-")
    broker = BrokerProcess(data_dir, *serve_args, env=env).start()
    try:
        yield broker
    finally:
        broker.close()
        if keep:
            print(f"broker data and log kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
