"""Which idempotency key each MQTT message in flight was published to Veil under, kept on disk, so
that a message the MQTT broker sends again after the bridge died or its connection dropped (same
packet id, DUP set) is published under the same key and Veil logs it once.

MQTT gives a message no id of its own: a packet id names it only until it is acknowledged, then
names the next one. So the journal keeps, per packet id, the last message received under it (a
digest of its topic and payload) and its key; a DUP message whose packet id and digest match is
that message again, and anything else gets a new key. Each group's entries are committed (SQLite,
synchronous FULL) before any of them is published: a key used in Veil is always found again.

A packet id's entry outlives the message's acknowledgement, since an acknowledgement can be lost
with its connection and the message then comes again; so a later message under the same packet id
is told from that one only by being written over it. Messages the bridge held unwritten when its
connection was replaced are forgotten (`forget`): they come again as DUPs and are new. What stays
is the bridge dying while it holds a message unwritten that is byte for byte the one acknowledged
before it under the same packet id: its DUP is taken for that one (and Veil answers it as a repeat,
within its idempotency window). Marking entries as acknowledged would turn that loss into a
duplicate, but a mark cannot be made at the moment the MQTT broker receives the acknowledgement,
and one made before it makes every crash between the two publish again what was in flight.
"""

from __future__ import annotations

import fcntl
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
        # one bridge per journal: another's packet ids would be taken for this one's
        self._lock = open(path + ".lock", "a")  # noqa: SIM115  # held for the journal's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise ValueError(f"--journal {path}: another bridge is using it") from None
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
            self._write("INSERT OR REPLACE INTO inflight (mid, digest, key) VALUES (?, ?, ?)", changed)
        return found

    def forget(self, mids: Sequence[int]) -> None:
        """Messages under these packet ids were received and never written: the next DUP under each
        is new, not an earlier message the entry names."""
        if mids:
            self._write("DELETE FROM inflight WHERE mid = ?", [(mid,) for mid in mids])

    def _write(self, statement: str, rows: Sequence[tuple[object, ...]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(statement, rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
        self._lock.close()
