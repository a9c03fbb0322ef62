"""Covering (seed 003's "allowed filters"): whether every publication a subscription matches is also
matched by a filter, so that a subscription can be admitted only inside what a client may ask for.

`covers(allowed, wanted)` holds when each constraint of `allowed` is implied by `wanted`'s constraints
on the same key. A constraint is implied when the key's constraints together with its negation
cannot all hold (the satisfiability check), and the key's values are of the constraint's class
(a predicate on a value of another class is false, so `gt 5` is not the negation of `le 5`). The
textual operators have no negation in the language; they are implied only by a value or pattern
that visibly satisfies them. The answer errs on one side only: a `False` may refuse a subscription
that was in fact covered, a `True` is always right (a property test holds it to the semantics).
"""

from __future__ import annotations

from collections.abc import Sequence

from veil.matching.predicates import Predicate, evaluate, predicate_class
from veil.matching.satisfiable import Unsatisfiable, check_satisfiable

_NEGATION = {"eq": "ne", "ne": "eq", "gt": "le", "ge": "lt", "lt": "ge", "le": "gt"}
TEXTUAL = frozenset({"contains", "starts_with", "ends_with"})


def covers(allowed: Sequence[Predicate], wanted: Sequence[Predicate]) -> bool:
    by_key: dict[str, list[Predicate]] = {}
    for predicate in wanted:
        by_key.setdefault(predicate.key, []).append(predicate)
    return all(_implied(constraint, by_key.get(constraint.key, [])) for constraint in allowed)


def covered_by_any(filters: Sequence[Sequence[Predicate]], wanted: Sequence[Predicate]) -> bool:
    return any(covers(allowed, wanted) for allowed in filters)


def _implied(constraint: Predicate, group: list[Predicate]) -> bool:
    if not group:  # the subscription also matches publications without the key
        return False
    if constraint.op == "exists":
        return True
    cls = predicate_class(constraint.op, constraint.value)
    if not any(p.op != "exists" and predicate_class(p.op, p.value) == cls for p in group):
        return False  # values of any class, or of another one
    if constraint.op in TEXTUAL:
        return _textual_implied(constraint, group)
    return all(_never(group + list(negation)) for negation in _negations(constraint))


def _negations(constraint: Predicate) -> list[list[Predicate]]:
    """Within the constraint's class of values, the conjunctions whose union is its negation."""
    key, op, value = constraint
    if op in _NEGATION:
        return [[Predicate(key, _NEGATION[op], value)]]
    if op == "between":
        low, high = value
        return [[Predicate(key, "lt", low)], [Predicate(key, "gt", high)]]
    if op == "in":
        return [[Predicate(key, "ne", v) for v in value]]
    raise ValueError(f"unknown operator {op!r}")


def _never(predicates: list[Predicate]) -> bool:
    try:
        check_satisfiable(predicates)
    except Unsatisfiable:
        return True
    return False


def _textual_implied(constraint: Predicate, group: list[Predicate]) -> bool:
    """A finite set of values that all satisfy it, or a pattern that entails it."""
    op, pattern = constraint.op, constraint.value
    for p in group:
        values = [p.value] if p.op == "eq" else p.value if p.op == "in" else None
        if values is not None and all(evaluate(op, pattern, v) for v in values):
            return True
        if p.op in TEXTUAL and isinstance(p.value, str) and _entails(p.op, p.value, op, pattern):
            return True
    return False


def _entails(op: str, value: str, wanted_op: str, pattern: str) -> bool:
    if wanted_op == "contains":
        return pattern in value  # any string that has `value` in it has `pattern` in it
    return op == wanted_op and (value.startswith(pattern) if op == "starts_with" else value.endswith(pattern))
