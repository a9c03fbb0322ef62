"""The store interface shared by the gateway (appends, queues, cursors) and the pipeline (log reads,
subscription snapshots, delivery writes). Implementations are chosen by URL: `sqlite:///path` (the
embedded default); a networked implementation fills the same interface for multi-machine runs.

Offsets are positions in one ordered log holding publications and subscription changes alike, so a
publication is matched against exactly the subscriptions whose changes precede it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

KIND_PUBLICATION = 0
KIND_SUBSCRIBE = 1
KIND_UNSUBSCRIBE = 2


class LogEntry(NamedTuple):
    offset: int
    kind: int
    sub_id: str | None
    body: bytes | None


Delivery = tuple[int, bytes]
"""(publication offset, published bytes): plain tuples, since one is made per delivery."""


class FeedEntry(NamedTuple):
    """The matches of one micro-batch: parallel arrays of subscription numbers and publication
    offsets, sorted by subscription number, then publication."""

    seq: int
    sub_nos: np.ndarray
    pubs: np.ndarray


class UnknownSubscription(LookupError):
    pass


class NotOwner(PermissionError):
    pass


class EventStore(ABC):
    # --- gateway side -------------------------------------------------------------------------
    @abstractmethod
    def append_publications(self, bodies: list[bytes]) -> list[int]:
        """Durably append publications (one commit for all); returns their offsets."""

    @abstractmethod
    def put_subscription(self, sub_id: str, owner: str, body: bytes) -> int:
        """Register or replace a subscription; NotOwner if the id belongs to someone else."""

    @abstractmethod
    def remove_subscription(self, sub_id: str, owner: str) -> int:
        """Unsubscribe and drop its queue; UnknownSubscription / NotOwner."""

    @abstractmethod
    def subscription_owner(self, sub_id: str) -> str | None: ...

    @abstractmethod
    def subscription_number(self, sub_id: str) -> int | None:
        """The compact number a subscription id goes by in queues and feeds."""

    @abstractmethod
    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        """The matches of the micro-batches queued after `seq`, in the order the pipeline wrote them."""

    @abstractmethod
    def bodies(self, pubs: np.ndarray) -> dict[int, bytes]:
        """The published bytes of these publications."""

    @abstractmethod
    def backlog(self, sub_id: str, after_pub: int, limit: int) -> tuple[list[Delivery], int]:
        """A subscription's queued deliveries after `after_pub`, in publication order, and the highest
        feed seq visible to the same read (so a caller knows what the live feed must add)."""

    @abstractmethod
    def cursor(self, sub_id: str) -> int: ...

    @abstractmethod
    def save_cursors(self, cursors: dict[str, int]) -> None: ...

    @abstractmethod
    def head_offset(self) -> int: ...

    @abstractmethod
    def last_feed_seq(self) -> int: ...

    # --- pipeline side ------------------------------------------------------------------------
    @abstractmethod
    def log_range(self, start: int, end: int) -> list[LogEntry]:
        """Entries with start < offset <= end, in offset order."""

    @abstractmethod
    def subscriptions_at(self, offset: int) -> list[tuple[str, int, bytes]]:
        """The subscriptions in force just after `offset`, as (id, number, body): what a matcher must
        hold there."""

    @abstractmethod
    def subscription_changes(self, after: int, upto: int) -> tuple[list[str], list[tuple[str, int, bytes]]]:
        """What changed between two offsets: ids to drop, then (id, number, body) to add."""

    @abstractmethod
    def record_deliveries(self, batch_id: int, sub_nos: np.ndarray, pubs: np.ndarray, processed: int) -> None:
        """Queue the (subscription number, publication) matches of a micro-batch as one feed entry and
        record the processed offset, in one transaction; matches of publications at or below the
        offset already recorded are dropped, so a replayed batch delivers nothing twice."""

    @abstractmethod
    def processed_offset(self) -> int: ...

    @abstractmethod
    def set_status(self, name: str, value: int) -> None: ...

    @abstractmethod
    def status(self, name: str) -> tuple[int, float] | None:
        """(value, unix time of the update) of a named status entry."""

    @abstractmethod
    def compact(self, limit: int, fanned_out: int, spill_before: float) -> int:
        """One bounded step of housekeeping. Feed entries that the hub has fanned out (seq <=
        `fanned_out`) and that were created before `spill_before` get their unconsumed matches
        spilled into per-subscription queues, then go; up to `limit` queued deliveries that their
        subscriptions consumed go, and so do publications that neither the pipeline nor any queue
        still needs. Returns the rows handled; below `limit` means nothing is left for now."""

    @abstractmethod
    def close(self) -> None: ...


def open_store(url: str) -> EventStore:
    if url.startswith("sqlite:///") or "://" not in url:
        from veil.store.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://"))
    raise ValueError(f"unsupported store URL {url!r}: use sqlite:///path/to/veil.db")
