"""The subscription index: the counting algorithm (SIENA / SELIS matcher).

Each subscription needs as many satisfied predicates as it has; a publication visits only the keys
it carries, and on each key only the predicates on that key: equality and `in` by hash lookup,
wildcards as a set, the remaining operators evaluated against the value. So a publication never
scans every subscription.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from veil.matching.predicates import Predicate, evaluate, value_class


class _KeyIndex:
    __slots__ = ("equal", "exists", "other")

    def __init__(self) -> None:
        self.equal: dict[tuple[str, object], dict[str, int]] = {}
        self.exists: dict[str, int] = {}
        self.other: dict[str, list[tuple[str, object]]] = {}

    def add(self, sub_id: str, op: str, target: object) -> None:
        if op == "exists":
            _bump(self.exists, sub_id, 1)
        elif op in ("eq", "in"):
            for v in target if op == "in" else (target,):  # type: ignore[union-attr]
                _bump(self.equal.setdefault((value_class(v), v), {}), sub_id, 1)
        else:
            self.other.setdefault(sub_id, []).append((op, target))

    def remove(self, sub_id: str, op: str, target: object) -> None:
        if op == "exists":
            _bump(self.exists, sub_id, -1)
        elif op in ("eq", "in"):
            for v in target if op == "in" else (target,):  # type: ignore[union-attr]
                bucket = self.equal[(value_class(v), v)]
                _bump(bucket, sub_id, -1)
                if not bucket:
                    del self.equal[(value_class(v), v)]
        else:
            self.other.pop(sub_id, None)

    def empty(self) -> bool:
        return not (self.equal or self.exists or self.other)

    def hits(self, value: object, counts: dict[str, int]) -> None:
        for bucket in (self.equal.get((value_class(value), value)), self.exists):
            if bucket:
                for sub_id, n in bucket.items():
                    counts[sub_id] += n
        for sub_id, predicates in self.other.items():
            n = sum(1 for op, target in predicates if evaluate(op, target, value))
            if n:
                counts[sub_id] += n


def _bump(bucket: dict[str, int], sub_id: str, delta: int) -> None:
    n = bucket.get(sub_id, 0) + delta
    if n:
        bucket[sub_id] = n
    else:
        bucket.pop(sub_id, None)


class SubscriptionIndex:
    def __init__(self) -> None:
        self._predicates: dict[str, list[Predicate]] = {}
        self._match_all: set[str] = set()
        self._keys: dict[str, _KeyIndex] = {}

    def __len__(self) -> int:
        return len(self._predicates)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._predicates

    def add(self, sub_id: str, predicates: Iterable[Predicate]) -> None:
        """Store a subscription; an existing one with the same id is replaced."""
        self.remove(sub_id)
        stored = [Predicate(*p) for p in predicates]
        self._predicates[sub_id] = stored
        if not stored:
            self._match_all.add(sub_id)
        for key, op, target in stored:
            self._keys.setdefault(key, _KeyIndex()).add(sub_id, op, target)

    def remove(self, sub_id: str) -> None:
        stored = self._predicates.pop(sub_id, None)
        if stored is None:
            return
        self._match_all.discard(sub_id)
        for key, op, target in stored:
            self._keys[key].remove(sub_id, op, target)
        for key in {p.key for p in stored}:
            if self._keys[key].empty():
                del self._keys[key]

    def match(self, attributes: Mapping[str, object]) -> list[str]:
        counts: dict[str, int] = defaultdict(int)
        for key, value in attributes.items():
            key_index = self._keys.get(key)
            if key_index is not None:
                key_index.hits(value, counts)
        found = [sub_id for sub_id, n in counts.items() if n == len(self._predicates[sub_id])]
        found.extend(self._match_all)
        return found
