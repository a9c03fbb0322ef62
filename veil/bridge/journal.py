"""Which idempotency key each MQTT message in flight was published to Veil under, kept on disk, so
that a message the MQTT broker sends again after the bridge died (same packet id, DUP set) is
published under the same key and Veil logs it once.

MQTT 3.1.1 gives a message no id of its own: a packet id names it only until it is acknowledged,
then names the next one. So the journal keeps, per packet id, the last message received under it
(a digest of its topic and payload) and its key; a redelivery is recognised by its packet id and
digest, and anything else gets a new key. Each group of entries is committed (SQLite, synchronous
FULL) before any of them is published: a key used in Veil is always found again. One case cannot
be told apart: the bridge dying between receiving a message and committing its entry, when that
message is byte for byte the one acknowledged before it under the same packet id; its redelivery is
then taken for that one (and Veil answers it as a repeat, within its idempotency window).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass


def digest(topic: str, payload: bytes) -> bytes:
    return hashlib.blake2b(topic.encode() + b"\x00" + payload, digest_size=16).digest()


@dataclass(frozen=True)
class Entry:
    mid: int
    digest: bytes
    dup: bool


class Journal:
    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS inflight (mid INTEGER PRIMARY KEY, digest BLOB NOT NULL, key TEXT NOT NULL)"
        )

    def keys(self, entries: Sequence[Entry], fresh: Sequence[str]) -> list[tuple[str, bool]]:
        """Each entry's key, and whether it is one it was published under before: a redelivery's
        earlier key, else its `fresh` one, recorded before this returns."""
        found: list[tuple[str, bool]] = []
        changed: list[tuple[int, bytes, str]] = []
        for entry, key in zip(entries, fresh, strict=True):
            row = (
                self._db.execute("SELECT digest, key FROM inflight WHERE mid = ?", (entry.mid,)).fetchone()
                if entry.dup
                else None
            )
            if row is not None and row[0] == entry.digest:
                found.append((row[1], True))
            else:
                found.append((key, False))
                changed.append((entry.mid, entry.digest, key))
        if changed:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO inflight (mid, digest, key) VALUES (?, ?, ?)", changed)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return found

    def close(self) -> None:
        self._db.close()
