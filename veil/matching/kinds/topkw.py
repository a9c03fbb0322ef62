"""Top-k/w by time (SPEC §5): the k best matching publications of a sliding time window, and the
k-skyband that decides them (which the count-window kind ranks with too).

A publication is in a subscription's window from its arrival (after the subscription was activated)
until `w` has passed; it ranks by its score (lower is better), ties going to the more recent one.
It is delivered once, at the first moment fewer than k publications of the window rank above it:
on arrival, or when better ones leave the window.

Each subscription keeps the strict k-skyband of its window (S4 §4.4.2): the publications that fewer
than k younger ones outrank. A publication outranked by k younger ones can never rank in the top k
again (those k stay in the window longer than it does), so it is dropped at once; the top k of the
window are always the first k of the skyband. An arrival costs a binary search and one pass over the
skyband's worse part, an expiry a removal and a look at the first k: nothing ever re-sorts the window.
Many arrivals at once (a round's matches of one subscription) are counted together between
expiries, in two linear passes, which gives the same skyband and deliveries as taking them one by one.

Expiries and arrivals of the same instant: expiries apply first. The moments at which the top k are
judged are every arrival and every distinct expiry time, so a publication promoted by an expiry is
delivered at that expiry's exact time, whenever the caller gets to `advance` the clock past it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from veil.matching.kinds.base import Arrivals, Selected
from veil.matching.kinds.scoring import Term, ranked, terms_of

VECTOR_FROM = 8  # arrivals in a segment from which counting them together beats one pass per arrival


class Skyband:
    """The strict k-skyband of one subscription: its publications ordered best first, each with its
    dominance counter (younger publications that outrank it), expiry time and whether it was
    delivered. Plain lists: a skyband is tens of entries, where list operations beat numpy calls."""

    __slots__ = ("arrivals", "counters", "delivered", "expires", "k", "latest", "ranks", "seqs", "window")

    def __init__(self, k: int, window: float) -> None:
        if k < 1 or not window > 0:
            raise ValueError("k must be at least 1 and the window positive")
        self.k = k
        self.window = window
        self.ranks: list[tuple[float, int]] = []  # (score, -seq): ascending = best first
        self.seqs: list[int] = []
        self.counters: list[int] = []
        self.expires: list[float] = []
        self.delivered: list[bool] = []
        self.arrivals: deque[tuple[float, int, float]] = deque()  # (expiry, seq, score), arrival order
        self.latest = -math.inf  # the last arrival's time

    def __len__(self) -> int:
        return len(self.ranks)

    def state(self) -> list[Any]:
        """Everything the skyband holds, as plain lists (for a serializer); `restore` inverts it."""
        return [
            self.k, self.window, self.latest, [list(r) for r in self.ranks], self.seqs, self.counters,
            self.expires, self.delivered, [list(a) for a in self.arrivals],
        ]  # fmt: skip

    @classmethod
    def restore(cls, state: list[Any]) -> Skyband:
        k, window, latest, ranks, seqs, counters, expires, delivered, arrivals = state
        band = cls(k, window)
        band.latest = latest
        band.ranks = [(score, neg) for score, neg in ranks]
        band.seqs, band.counters, band.expires, band.delivered = seqs, counters, expires, delivered
        band.arrivals = deque((e, seq, score) for e, seq, score in arrivals)
        return band

    def next_expiry(self) -> float | None:
        """When the oldest publication still held leaves the window (the next moment an expiry may
        promote one), or None when nothing is held."""
        self._forget_dropped()
        return self.arrivals[0][0] if self.arrivals else None

    def arrive(self, seq: int, time: float, score: float, expiries_judged: bool = True) -> list[Selected]:
        """Add a publication; return what is delivered up to and at `time`, in time order. Sequence
        numbers must increase; a time before the last arrival's counts as that one (a clock that
        stepped back must not reorder the window). Without `expiries_judged` the expiries at `time`
        are not a moment of their own: the window is judged once, with the arrival in it (a count
        window, whose every expiry is an arrival's)."""
        time = self.latest = max(time, self.latest)
        delivered = self.advance(time, judge=expiries_judged)
        rank = (score, -seq)
        position = bisect_left(self.ranks, rank)
        counters = self.counters
        keep = position
        for i in range(position, len(counters)):  # everything worse is outranked by one more younger
            counters[i] += 1
            if counters[i] < self.k:
                if keep != i:
                    self._move(i, keep)
                keep += 1
        if keep < len(counters):
            for column in (self.ranks, self.seqs, self.counters, self.expires, self.delivered):
                del column[keep:]
        self.ranks.insert(position, rank)
        self.seqs.insert(position, seq)
        self.counters.insert(position, 0)
        self.expires.insert(position, time + self.window)
        in_top = position < self.k
        self.delivered.insert(position, in_top and expiries_judged)  # else judged below
        self.arrivals.append((time + self.window, seq, score))
        self._bound_arrivals()
        if not expiries_judged:
            self._judge(time, delivered)
        elif in_top:
            delivered.append(Selected(seq, time))
        return delivered

    def arrive_many(self, seqs: list[int], times: list[float], scores: np.ndarray) -> list[Selected]:
        """`arrive` for consecutive publications, the same result, computed by segment: between two
        expiries, arrivals only push publications down, so which arrive in the top k and which end
        dominated follows from counting, for each one, the better ones before and after it (up to
        k), in two passes over the segment instead of a pass over the skyband per arrival."""
        delivered: list[Selected] = []
        times = np.maximum.accumulate(np.asarray(times)).tolist() if times else []
        early = bisect_left(times, self.latest)  # before the last arrival: counts as that one
        times[:early] = [self.latest] * early
        i = 0
        while i < len(seqs):
            delivered += self.advance(times[i])
            due = self.next_expiry()
            end = bisect_left(times, min(math.inf if due is None else due, times[i] + self.window), i, len(times))
            if end - i < VECTOR_FROM:
                for j in range(i, end):
                    delivered += self.arrive(seqs[j], times[j], float(scores[j]))
            else:
                delivered += self._segment(seqs[i:end], times[i:end], scores[i:end])
            i = end
        return delivered

    def _segment(self, seqs: list[int], times: list[float], scores: np.ndarray) -> list[Selected]:
        """Arrivals with no expiry among or before them. Ties rank the younger first, so a held
        publication is outranked by an arrival scoring at most as much, an arrival by an earlier one
        scoring less, and by a later one scoring at most as much. Two passes that keep the k lowest
        scores seen (a heap): forwards, an arrival enters the top k when at most k-1 held or earlier
        ones score less; backwards, it stays in the skyband when fewer than k later ones score at
        most as much. An arrival that does neither leaves the heap as it was, so the passes visit
        only those that `_block_bounds` cannot rule out."""
        k = self.k
        values = scores.tolist()
        early, late = _block_bounds(scores, k, self.ranks[k - 1][0] if len(self.ranks) >= k else math.inf)
        bound = [-score for score, _ in self.ranks[:k]]  # the k lowest so far, negated: a max-heap
        heapq.heapify(bound)
        in_top: list[int] = []
        for j in np.flatnonzero(scores <= early).tolist():
            value = values[j]
            if len(bound) < k:
                in_top.append(j)
                heapq.heappush(bound, -value)
            elif value <= -bound[0]:
                in_top.append(j)
                heapq.heapreplace(bound, -value)
        bound = []
        keep_new: list[int] = []
        later: list[int] = []  # of each kept arrival: the later ones scoring at most as much (< k)
        for j in reversed(np.flatnonzero(scores < late).tolist()):
            value = values[j]
            if len(bound) < k or value < -bound[0]:
                keep_new.append(j)
                later.append(sum(-other <= value for other in bound))
                if len(bound) < k:
                    heapq.heappush(bound, -value)
                else:
                    heapq.heapreplace(bound, -value)
        keep_new.reverse()
        later.reverse()
        held = np.array([score for score, _ in self.ranks], np.float64)
        counters = np.array(self.counters, np.int64) + np.searchsorted(np.sort(scores), held, "right")
        keep_held = np.flatnonzero(counters < k).tolist()
        columns: tuple[list[Any], ...] = (self.ranks, self.seqs, self.counters, self.expires, self.delivered)
        kept = [[column[i] for i in keep_held] for column in columns]
        kept[2] = counters[keep_held].tolist()
        top = set(in_top)
        new: list[list[Any]] = [
            [(values[j], -seqs[j]) for j in keep_new],
            [seqs[j] for j in keep_new],
            later,
            [times[j] + self.window for j in keep_new],
            [j in top for j in keep_new],
        ]
        order = sorted(range(len(kept[0]) + len(new[0])), key=(kept[0] + new[0]).__getitem__)
        for column, old, added in zip(columns, kept, new, strict=True):
            merged = old + added
            column[:] = [merged[i] for i in order]
        self.arrivals.extend((times[j] + self.window, seqs[j], values[j]) for j in keep_new)
        self._bound_arrivals()
        self.latest = times[-1]
        return [Selected(seqs[j], times[j]) for j in in_top]

    def advance(self, now: float, judge: bool = True) -> list[Selected]:
        """Apply the expiries up to `now`; return the publications they promoted into the top k,
        each at the expiry time that promoted it (none without `judge`: see `arrive`)."""
        delivered: list[Selected] = []
        while True:
            self._forget_dropped()
            if not self.arrivals or self.arrivals[0][0] > now:
                return delivered
            moment = self.arrivals[0][0]
            while self.arrivals and self.arrivals[0][0] == moment:
                _, seq, score = self.arrivals.popleft()
                position = bisect_left(self.ranks, (score, -seq))
                if position < len(self.ranks) and self.seqs[position] == seq:
                    for column in (self.ranks, self.seqs, self.counters, self.expires, self.delivered):
                        del column[position]
            if judge:
                self._judge(moment, delivered)

    def _judge(self, moment: float, delivered: list[Selected]) -> None:
        """The top k not delivered yet are delivered at `moment` (appended to `delivered`)."""
        flags = self.delivered
        for i in range(min(self.k, len(flags))):
            if not flags[i]:
                flags[i] = True
                delivered.append(Selected(self.seqs[i], moment))

    def _bound_arrivals(self) -> None:
        """Dropped publications linger in `arrivals` until they come up: rebuild it from what is
        held once they are most of it, so that memory follows the skyband, not the window."""
        if len(self.arrivals) > 2 * len(self.ranks) + 8:
            held = sorted(zip(self.expires, (-r[1] for r in self.ranks), (r[0] for r in self.ranks), strict=True))
            self.arrivals = deque(held)

    def _move(self, source: int, target: int) -> None:
        columns: tuple[list[Any], ...] = (self.ranks, self.seqs, self.counters, self.expires, self.delivered)
        for column in columns:
            column[target] = column[source]

    def _forget_dropped(self) -> None:
        """Arrivals whose publication was dropped as dominated are skipped when they come up."""
        arrivals = self.arrivals
        while arrivals:
            _, seq, score = arrivals[0]
            position = bisect_left(self.ranks, (score, -seq))
            if position < len(self.ranks) and self.seqs[position] == seq:
                return
            arrivals.popleft()


def _block_bounds(scores: np.ndarray, k: int, held: float) -> tuple[np.ndarray, np.ndarray]:
    """For each arrival of a segment, bounds its score must meet to enter the top k (at most
    `early`) and to stay in the skyband (below `late`), from the k-th lowest score of each block of
    arrivals: an arrival needs to score at most the k-th lowest of the `held` ones and of any
    earlier block, and less than the k-th lowest of any later block. Vectorised, where the exact
    passes are Python loops: with random scores they are left with a few arrivals per block."""
    size = max(4 * k, 32)
    blocks = -(-len(scores) // size)
    padded = np.full(blocks * size, math.inf)
    padded[: len(scores)] = scores
    kth = np.partition(padded.reshape(blocks, size), k - 1, axis=1)[:, k - 1]
    before = np.minimum.accumulate(np.concatenate(([held], kth[:-1])))
    after = np.minimum.accumulate(np.concatenate((kth[1:], [math.inf]))[::-1])[::-1]
    return np.repeat(before, size)[: len(scores)], np.repeat(after, size)[: len(scores)]


class TopKW(NamedTuple):
    """The spec: the k best of the last `window` milliseconds of the log's clock."""

    k: int
    window: float
    terms: tuple[Term, ...]


class TimeWindow:
    """One subscription's window: its skyband, whose clock is the log's."""

    __slots__ = ("band", "terms")

    def __init__(self, spec: TopKW, band: Skyband | None = None) -> None:
        self.terms = spec.terms
        self.band = Skyband(spec.k, spec.window) if band is None else band

    def arrive(self, arrivals: Arrivals) -> list[Selected]:
        return self.band.arrive_many(*ranked(self.terms, arrivals))

    def advance(self, now: float) -> list[Selected]:
        return self.band.advance(now)

    def snapshot(self) -> list[Any]:
        return self.band.state()

    def next_due(self) -> float | None:
        return self.band.next_expiry()

    def held(self) -> list[int]:
        return self.band.seqs


class TimeWindows:
    """The kind: a `topk` document with a window `w` in milliseconds."""

    name = "top-k/w"

    def parse(self, doc: Mapping[str, Any]) -> TopKW | None:
        if "w" not in doc:
            return None
        return TopKW(int(doc["k"]), float(doc["w"]), terms_of(doc))

    def start(self, spec: TopKW) -> TimeWindow:
        return TimeWindow(spec)

    def restore(self, spec: TopKW, snapshot: list[Any]) -> TimeWindow:
        return TimeWindow(spec, Skyband.restore(snapshot))


KIND = TimeWindows()
