"""What a stateful subscription kind is to the rest of Veil (SPEC §5).

A plain subscription delivers each publication its filter and its authorization pass. A stateful one
decides over what it matched so far: which of its matches to deliver, and when, depends on the others
(the k best of a window). The pipeline finds a stateful subscription's matches with the same index as
every other's and hands them, in log order, to the subscription's state; the state answers with what
it selects, now or later, as the log's clock moves. Between rounds the state is saved as a snapshot
of plain lists, with the round that changed it, and restored from there by whichever worker runs the
partition next.

A kind is a `Kind` (its spec from the subscription's document, the document from its spec, a fresh or
restored state) and a `KindState` (arrive, advance, snapshot, next-due, oldest-held). The registry
(`veil.matching.kinds`) finds a subscription's kind from its document; nothing outside this package
knows what kinds there are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np


class Selected(NamedTuple):
    """A publication a stateful subscription delivers, and the moment it was selected (the log's
    clock, in milliseconds)."""

    seq: int  # the publication, as the caller numbered it (its log offset: arrival order)
    time: float


class NumericColumns:
    """The numeric values of one key across a run of documents (NaN where absent or not a finite
    number), built on first use: scoring a subscription's matches is then a few numpy calls."""

    def __init__(self, documents: Sequence[Mapping[str, object]]) -> None:
        self.documents = documents
        self._columns: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        column = self._columns.get(key)
        if column is None:
            values = [doc.get(key) for doc in self.documents]
            column = self._columns[key] = np.array(
                [v if isinstance(v, int | float) and not isinstance(v, bool) else math.nan for v in values], np.float64
            )
            column[~np.isfinite(column)] = math.nan
        return column


class Arrivals(NamedTuple):
    """Consecutive matches of one subscription, in log order: the publications' numbers and times,
    their documents as the positions of a run's columns, and the documents that replace some of them
    (by index here): a cropped copy is judged on what its subscriber would see."""

    seqs: list[int]
    times: list[float]
    columns: NumericColumns
    positions: np.ndarray
    replaced: Mapping[int, Mapping[str, object]]


class KindState(Protocol):
    """One subscription's state."""

    def arrive(self, arrivals: Arrivals) -> list[Selected]:
        """Take in its next matches; what they select, up to and at the last one's time, in time order.
        Times that go back count as the latest one seen (a clock that stepped back reorders nothing)."""
        ...

    def advance(self, now: float) -> list[Selected]:
        """Let the clock move to `now` with nothing arriving; what that selects, in time order."""
        ...

    def snapshot(self) -> list[Any]:
        """Everything the state holds, as plain lists and numbers (for msgpack); `Kind.restore`
        inverts it."""
        ...

    def next_due(self) -> float | None:
        """The earliest moment the clock alone may select something (None: only arrivals will): the
        clock must be moved to it even when nothing is published."""
        ...

    def held(self) -> Sequence[int]:
        """The publications it may still select: the store keeps them until it no longer does."""
        ...


class Kind(Protocol):
    """A stateful subscription kind: what the registry holds of it."""

    name: str  # for messages and metrics

    def parse(self, doc: Mapping[str, Any]) -> Any | None:
        """The kind's spec from a subscription's `topk` document (as the protocol validated it and
        the log keeps it), or None if the document is not of this kind."""
        ...

    def start(self, spec: Any) -> KindState:
        """A new subscription's state: nothing matched yet."""
        ...

    def restore(self, spec: Any, snapshot: list[Any]) -> KindState:
        """The state a snapshot of it was taken of."""
        ...
