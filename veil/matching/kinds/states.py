"""The stateful subscriptions of one matcher, whatever their kinds, by subscription number: their
matches go in, what they select comes out, and the clock is moved for all of them at once through a
heap of their next due moments."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from veil.matching.kinds.base import Arrivals, Kind, KindState, Selected
from veil.matching.kinds.registry import KINDS


class UnknownKind(ValueError):
    """A `topk` document no kind takes (a log written by a newer version)."""


class KindStates:
    def __init__(self, kinds: tuple[Kind, ...] = KINDS) -> None:
        self.kinds = kinds
        self.specs: dict[int, tuple[Kind, Any]] = {}
        self.states: dict[int, KindState] = {}
        self._due: list[tuple[float, int]] = []  # (next due moment, number), with stale entries
        self._scheduled: dict[int, float] = {}  # number -> its entry in _due that is not stale
        self.touched: set[int] = set()  # numbers whose state changed (or went) since the caller cleared it

    def __len__(self) -> int:
        return len(self.specs)

    def __contains__(self, number: int) -> bool:
        return number in self.specs

    def spec(self, doc: Mapping[str, Any]) -> tuple[Kind, Any]:
        """The kind of a `topk` document and its spec, before anything changes (UnknownKind)."""
        for kind in self.kinds:
            spec = kind.parse(doc)
            if spec is not None:
                return kind, spec
        raise UnknownKind(f"no subscription kind takes {sorted(doc)}")

    def add(self, number: int, kind: Kind, spec: Any) -> None:
        """Activate (or replace) a subscription: it starts with nothing matched."""
        self.specs[number] = (kind, spec)
        self.states[number] = kind.start(spec)
        self._scheduled.pop(number, None)
        self.touched.add(number)

    def restore(self, number: int, snapshot: list[Any]) -> None:
        """Put back the saved state of a subscription added before."""
        kind, spec = self.specs[number]
        state = self.states[number] = kind.restore(spec, snapshot)
        self._scheduled.pop(number, None)
        self._schedule(number, state)

    def remove(self, number: int) -> None:
        self.specs.pop(number, None)
        self.states.pop(number, None)
        self._scheduled.pop(number, None)
        self.touched.add(number)

    def arrive(self, number: int, arrivals: Arrivals) -> list[Selected]:
        """One subscription's next matches; what they select."""
        state = self.states[number]
        selected = state.arrive(arrivals)
        self._schedule(number, state)
        self.touched.add(number)
        return selected

    def advance(self, now: float) -> list[tuple[int, Selected]]:
        """What the clock's move to `now` selects across all subscriptions: (number, selected) pairs
        in time order."""
        selected: list[tuple[int, Selected]] = []
        while self._due and self._due[0][0] <= now:
            due, number = heapq.heappop(self._due)
            if self._scheduled.get(number) != due:
                continue
            del self._scheduled[number]
            state = self.states[number]
            selected.extend((number, s) for s in state.advance(now))
            self._schedule(number, state)
            self.touched.add(number)
        selected.sort(key=lambda pair: pair[1].time)
        return selected

    def oldest_held(self) -> int | None:
        """The lowest publication any state may still select."""
        return min((min(held) for state in self.states.values() if (held := state.held())), default=None)

    def next_due(self) -> float | None:
        """The earliest moment the clock alone may select something."""
        while self._due and self._scheduled.get(self._due[0][1]) != self._due[0][0]:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def _schedule(self, number: int, state: KindState) -> None:
        due = state.next_due()
        if due is None:
            self._scheduled.pop(number, None)
        elif self._scheduled.get(number) != due:
            self._scheduled[number] = due
            heapq.heappush(self._due, (due, number))
