"""Top-k of the last n (seed 004, SPEC §5): the k best of a subscription's last n matching publications.

A count-based window: a publication is in it from its arrival (after the subscription was activated)
until n more have arrived, and only what enters a window counts (a publication its subscriber may not
see, or one its terms cannot rank, moves nothing). Otherwise it is decided exactly as the time window
is: ranked by score (lower is better, ties going to the more recent), delivered once, at the first
moment fewer than k of the window rank above it, on arrival or when better ones leave the window.

The same k-skyband decides it, with the subscription's own count of arrivals as its clock and n as
its window: the publication that arrived m-th leaves as the (m+n)-th arrives, and the window is
judged once, with the newcomer in it (a time window judges an expiry's instant on its own, but here
every expiry is an arrival's: a publication the one leaving kept out of the top k may be kept out by
the newcomer instead). So a count window's publications arrive one at a time, not counted together
by segments as a time window's are; one promoted is delivered at the log time of the arrival that
pushed the other out.

A publication also leaves MAX_AGE_MS after it arrived, the longest time window the broker takes by
default: a window that stops filling would otherwise hold its publications, and the store the log
under the oldest of them, for ever. Arrival order is the same by both clocks, so this is one more
expiry of the oldest held publication (the count clock jumps to its count expiry), due by time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from veil.matching.kinds.base import Arrivals, Selected
from veil.matching.kinds.scoring import Term, ranked, terms_of
from veil.matching.kinds.topkw import Skyband

MAX_AGE_MS = 30 * 24 * 3600 * 1000


class TopKN(NamedTuple):
    """The spec: the k best of the last `n` matching publications."""

    k: int
    n: int
    terms: tuple[Term, ...]


class CountWindow:
    """One subscription's window: its skyband, whose clock counts the publications that entered it."""

    __slots__ = ("arrived", "band", "terms", "times")

    def __init__(
        self, spec: TopKN, band: Skyband | None = None, arrived: int = 0, times: dict[int, float] | None = None
    ) -> None:
        self.terms = spec.terms
        self.band = Skyband(spec.k, spec.n) if band is None else band
        self.arrived = arrived  # publications that entered the window so far: the clock
        self.times = times or {}  # when each publication it holds arrived (the log's clock)

    def arrive(self, arrivals: Arrivals) -> list[Selected]:
        seqs, times, scores = ranked(self.terms, arrivals)
        selected = self.advance(times[0]) if times else []
        for seq, time, score in zip(seqs, times, scores.tolist(), strict=True):
            self.arrived += 1
            chosen = self.band.arrive(seq, self.arrived, score, expiries_judged=False)
            selected += [Selected(one.seq, time) for one in chosen]
        self.times.update(zip(seqs, times, strict=True))
        if len(self.times) > 2 * len(self.band) + 8:  # those dropped or gone: memory follows the skyband
            self.times = {seq: self.times[seq] for seq in self.band.seqs}
        return selected

    def advance(self, now: float) -> list[Selected]:
        """The held publications MAX_AGE_MS old by `now` leave, oldest first; each leaving is judged
        at the moment it left."""
        selected: list[Selected] = []
        while (due := self._oldest()) is not None and due[1] + MAX_AGE_MS <= now:
            moment = due[1] + MAX_AGE_MS
            selected += [Selected(s.seq, moment) for s in self.band.advance(due[0])]
        return selected

    def snapshot(self) -> list[Any]:
        return [self.band.state(), self.arrived, [[seq, self.times[seq]] for seq in self.band.seqs]]

    def next_due(self) -> float | None:
        oldest = self._oldest()
        return None if oldest is None else oldest[1] + MAX_AGE_MS

    def _oldest(self) -> tuple[float, float] | None:
        """The oldest held publication's count expiry and arrival time."""
        expiry = self.band.next_expiry()  # of the oldest held: it is first in arrival order
        return None if expiry is None else (expiry, self.times[self.band.arrivals[0][1]])

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
        band, arrived, times = snapshot
        return CountWindow(spec, Skyband.restore(band), arrived, {int(seq): time for seq, time in times})


KIND = CountWindows()
