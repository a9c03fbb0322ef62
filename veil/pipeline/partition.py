"""Routing of subscriptions to matcher partitions (SPEC §1: partition stage).

A stable hash (CRC-32, not Python's salted `hash`) sends a subscription and every later change to
it to the same partition in every process; publications go to all partitions.
"""

from __future__ import annotations

import zlib


def partition_of(sub_id: str, partitions: int) -> int:
    return zlib.crc32(sub_id.encode()) % partitions
