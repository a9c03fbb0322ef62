"""Refusing subscriptions that can never match (SPEC §2.2), key by key.

Per key, the constraints must agree on one value class; a finite candidate set (eq, in) is tested
value by value; otherwise the constraints are intersected as an interval (prefixes become intervals
too), and a single-point interval is tested as a candidate.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from veil.matching.predicates import Predicate, evaluate, predicate_class


class Unsatisfiable(ValueError):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"constraints on {key!r} can never all hold: {reason}")
        self.key = key
        self.reason = reason


def check_satisfiable(predicates: list[Predicate]) -> None:
    by_key: dict[str, list[Predicate]] = defaultdict(list)
    for predicate in predicates:
        by_key[predicate.key].append(predicate)
    for key, group in by_key.items():
        _check_key(key, group)


def _check_key(key: str, group: list[Predicate]) -> None:
    typed = [p for p in group if p.op != "exists"]
    classes = {predicate_class(p.op, p.value) for p in typed}
    if len(classes) > 1:
        raise Unsatisfiable(key, f"they need values of different types ({', '.join(sorted(map(str, classes)))})")
    if not typed:
        return
    (cls,) = classes
    assert cls is not None  # only `exists` has no class, and it is not among `typed`
    candidates = _finite_candidates(typed, cls)
    low, high = _interval(typed)
    if candidates is None:
        if _empty(low, high):
            raise Unsatisfiable(key, "the ranges do not overlap")
        if low is not None and high is not None and low[0] == high[0]:
            candidates = [low[0]]
        elif high == ("", True):
            candidates = [""]  # nothing sorts below the empty string: it is the only value left
    if candidates is not None and not _any_satisfies(typed, candidates, low, high):
        raise Unsatisfiable(key, "no value satisfies all of them")


def _any_satisfies(typed: list[Predicate], candidates: list[Any], low: Bound, high: Bound) -> bool:
    """Whether some candidate satisfies every constraint. All of them share one class of values, so
    (in)equalities are set look-ups and the ordering constraints one interval test: a hostile
    subscription of thousands of constraints on thousands of `in` values costs their sum, not their
    product. Only the textual constraints look at each remaining candidate, one constraint at a time."""
    excluded = {p.value for p in typed if p.op == "ne"}
    found = [v for v in candidates if v not in excluded and _inside(v, low, high)]
    for p in typed:
        if not found:
            break
        if p.op in ("eq", "in"):
            allowed = {p.value} if p.op == "eq" else set(p.value)
            found = [v for v in found if v in allowed]
        elif p.op in ("contains", "starts_with", "ends_with"):
            found = [v for v in found if evaluate(p.op, p.value, v)]
    return bool(found)


def _inside(value: Any, low: Bound, high: Bound) -> bool:
    if low is not None and (value < low[0] or (value == low[0] and not low[1])):
        return False
    return high is None or bool(value < high[0] or (value == high[0] and high[1]))


def _finite_candidates(typed: list[Predicate], cls: str) -> list[Any] | None:
    if cls == "bool":
        return [True, False]
    found: list[Any] | None = None
    for p in typed:
        values = [p.value] if p.op == "eq" else p.value if p.op == "in" else None
        if values is not None:  # one class of values per key: a set's equality is the list's, in linear time
            allowed = set(values)
            found = list(values) if found is None else [v for v in found if v in allowed]
    return found


Bound = tuple[Any, bool] | None  # (value, inclusive): numbers or strings, one class per key


def _interval(typed: list[Predicate]) -> tuple[Bound, Bound]:
    low: Bound = None
    high: Bound = None
    for p in typed:
        if p.op in ("gt", "ge"):
            low = _tighter(low, (p.value, p.op == "ge"), lower=True)
        elif p.op in ("lt", "le"):
            high = _tighter(high, (p.value, p.op == "le"), lower=False)
        elif p.op == "between":
            low = _tighter(low, (p.value[0], True), lower=True)
            high = _tighter(high, (p.value[1], True), lower=False)
        elif p.op == "starts_with":
            low = _tighter(low, (p.value, True), lower=True)
            successor = _prefix_successor(p.value)
            if successor is not None:
                high = _tighter(high, (successor, False), lower=False)
    return low, high


def _tighter(current: Bound, new: tuple[Any, bool], lower: bool) -> Bound:
    if current is None:
        return new
    (cv, ci), (nv, ni) = current, new
    if cv == nv:
        return (cv, ci and ni)
    return new if (nv > cv) == lower else current


def _empty(low: Bound, high: Bound) -> bool:
    if high is not None and high[0] == "" and not high[1]:
        return True  # nothing sorts below the empty string
    if low is None or high is None:
        return False
    (lv, li), (hv, hi) = low, high
    return bool(lv > hv or (lv == hv and not (li and hi)))


def _prefix_successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with `prefix` (None: no such string)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(last + 1)
        prefix = prefix[:-1]
    return None
