"""Top-k of the last n (seed 004, SPEC §5): the k best of a subscription's last n matching publications.

A count-based window: a publication is in it from its arrival (after the subscription was activated)
until n more have arrived, and only what enters a window counts (a publication its subscriber may not
see, or one its terms cannot rank, moves nothing). Otherwise it is decided exactly as the time window
is: ranked by score (lower is better, ties going to the more recent), delivered once, at the first
moment fewer than k of the window rank above it, on arrival or when better ones leave the window.

The same k-skyband decides it, with the subscription's own count of arrivals as its clock and n as
its window: the publication that arrived m-th leaves when the (m+n)-th arrives, before that one is
judged, as an expiry does at its instant. A publication promoted by one leaving is delivered at the
log time of the arrival that pushed the other out. The clock alone never moves a count, so such a
subscription is never due.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from veil.matching.kinds.base import Arrivals, Selected
from veil.matching.kinds.scoring import Term, ranked, terms_of
from veil.matching.kinds.topkw import Skyband


class TopKN(NamedTuple):
    """The spec: the k best of the last `n` matching publications."""

    k: int
    n: int
    terms: tuple[Term, ...]


class CountWindow:
    """One subscription's window: its skyband, whose clock counts the publications that entered it."""

    __slots__ = ("arrived", "band", "terms")

    def __init__(self, spec: TopKN, band: Skyband | None = None, arrived: int = 0) -> None:
        self.terms = spec.terms
        self.band = Skyband(spec.k, spec.n) if band is None else band
        self.arrived = arrived  # publications that entered the window so far: the clock

    def arrive(self, arrivals: Arrivals) -> list[Selected]:
        seqs, times, scores = ranked(self.terms, arrivals)
        first = self.arrived + 1
        self.arrived += len(seqs)
        counted = self.band.arrive_many(seqs, list(range(first, self.arrived + 1)), scores)
        return [Selected(seq, times[int(count) - first]) for seq, count in counted]

    def advance(self, now: float) -> list[Selected]:
        return []

    def snapshot(self) -> list[Any]:
        return [self.band.state(), self.arrived]

    def next_due(self) -> float | None:
        return None

    def held(self) -> list[int]:
        return self.band.seqs


class CountWindows:
    """The kind: a `topk` document with a count `n` of publications."""

    name = "top-k of the last n"

    def parse(self, doc: Mapping[str, Any]) -> TopKN | None:
        if "n" not in doc:
            return None
        return TopKN(int(doc["k"]), int(doc["n"]), terms_of(doc))

    def start(self, spec: TopKN) -> CountWindow:
        return CountWindow(spec)

    def restore(self, spec: TopKN, snapshot: list[Any]) -> CountWindow:
        band, arrived = snapshot
        return CountWindow(spec, Skyband.restore(band), arrived)


KIND = CountWindows()
