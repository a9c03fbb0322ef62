"""Typed predicates and their semantics (SPEC §2.2).

A predicate on key K is true only if the publication has K with a value of a comparable class:
int and float compare as numbers, strings by code point, booleans only for (in)equality. So `ne`
on a missing key, or on a value of another class, is false.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Predicate(NamedTuple):
    key: str
    op: str
    value: Any  # a JSON scalar, a list of them (between, in) or None (exists): checked by the protocol


def value_class(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def predicate_class(op: str, value: Any) -> str | None:
    """The class of value a predicate can be true for; None for the wildcard (any value)."""
    if op == "exists":
        return None
    if op in ("between", "in"):
        return value_class(value[0])
    return value_class(value)


def evaluate(op: str, target: Any, value: Any) -> bool:
    """`target` and `value` are JSON values (Any: the protocol checked the target's type against the
    operator, and the classes are compared here before any ordering)."""
    if op == "exists":
        return True
    cls = value_class(value)
    if cls != predicate_class(op, target):
        return False
    if op == "eq":
        return bool(value == target)
    if op == "ne":
        return bool(value != target)
    if op == "gt":
        return bool(value > target)
    if op == "ge":
        return bool(value >= target)
    if op == "lt":
        return bool(value < target)
    if op == "le":
        return bool(value <= target)
    if op == "between":
        low, high = target
        return bool(low <= value <= high)
    if op == "in":
        return value in target
    if op == "contains":
        return target in value
    if op == "starts_with":
        return bool(value.startswith(target))
    if op == "ends_with":
        return bool(value.endswith(target))
    raise ValueError(f"unknown operator {op!r}")


def matches(predicates: list[Predicate], attributes: Mapping[str, object]) -> bool:
    """The reference semantics, against which the index is tested."""
    for key, op, target in predicates:
        if key not in attributes or not evaluate(op, target, attributes[key]):
            return False
    return True
