"""The rows that pass between the pipeline's stages, and the marker rows among them.

Source → match (`LOG_SCHEMA`): one row per log entry routed to a matcher partition, after a mark row
(kind `MARK`) whose `offset` is the start of the batch's log range and whose `until` is its end.

Match → exit point (`MATCH_SCHEMA`): one row per authorized (publication offset, subscription
number) match, with the cropped copy it delivers where one applies. Marker rows carry a negative
subscription number: `MARK` (its offset: how far the task processed the log), `STATEFUL` (its copy:
the task's top-k/w output, `encode_stateful`) and `QUARANTINE` (its copy: an entry the task set
aside, `encode_quarantined`).
"""

from __future__ import annotations

import msgspec
import pyarrow as pa

from veil.store import Quarantined, StatefulBatch

MARK = -1
STATEFUL = -2
QUARANTINE = -3

LOG_SCHEMA = (
    "part INT, offset LONG, kind INT, sub_id STRING, number LONG, body BINARY, client STRING, time LONG, until LONG"
)
LOG_ARROW = pa.schema(
    [
        ("part", pa.int32()),
        ("offset", pa.int64()),
        ("kind", pa.int32()),
        ("sub_id", pa.string()),
        ("number", pa.int64()),
        ("body", pa.binary()),
        ("client", pa.string()),
        ("time", pa.int64()),
        ("until", pa.int64()),
    ]
)
MATCH_SCHEMA = "offset LONG, sub_no LONG, copy BINARY"
MATCH_ARROW = pa.schema([("offset", pa.int64()), ("sub_no", pa.int64()), ("copy", pa.binary())])


def marker(sub_no: int, offset: int, blob: bytes) -> pa.RecordBatch:
    """A STATEFUL or QUARANTINE row."""
    return pa.RecordBatch.from_arrays(
        [pa.array([offset], pa.int64()), pa.array([sub_no], pa.int64()), pa.array([blob], pa.binary())],
        schema=MATCH_ARROW,
    )


def encode_stateful(batch: StatefulBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode_stateful(blob: bytes) -> StatefulBatch:
    deliveries, initials, bands, held, due = msgspec.msgpack.decode(blob)
    return StatefulBatch(
        [tuple(d) for d in deliveries],
        [tuple(i) for i in initials],
        [tuple(b) for b in bands],
        held,
        due,  # type: ignore[misc]
    )


def encode_quarantined(entry: Quarantined) -> bytes:
    return msgspec.msgpack.encode(entry)


def decode_quarantined(blob: bytes) -> Quarantined:
    return Quarantined(*msgspec.msgpack.decode(blob))
