"""Typed predicates and their semantics (SPEC §2.2).

A predicate on key K is true only if the publication has K with a value of a comparable class:
int and float compare as numbers, strings by code point, booleans only for (in)equality. So `ne`
on a missing key, or on a value of another class, is false.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Predicate(NamedTuple):
    key: str
    op: str
    value: object


def value_class(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def predicate_class(op: str, value: object) -> str | None:
    """The class of value a predicate can be true for; None for the wildcard (any value)."""
    if op == "exists":
        return None
    if op in ("between", "in"):
        return value_class(value[0])  # type: ignore[index]
    return value_class(value)


def evaluate(op: str, target: object, value: object) -> bool:
    if op == "exists":
        return True
    cls = value_class(value)
    if cls != predicate_class(op, target):
        return False
    if op == "eq":
        return value == target
    if op == "ne":
        return value != target
    if op == "gt":
        return value > target  # type: ignore[operator]
    if op == "ge":
        return value >= target  # type: ignore[operator]
    if op == "lt":
        return value < target  # type: ignore[operator]
    if op == "le":
        return value <= target  # type: ignore[operator]
    if op == "between":
        low, high = target  # type: ignore[misc]
        return low <= value <= high
    if op == "in":
        return value in target  # type: ignore[operator]
    if op == "contains":
        return target in value  # type: ignore[operator]
    if op == "starts_with":
        return value.startswith(target)  # type: ignore[union-attr]
    if op == "ends_with":
        return value.endswith(target)  # type: ignore[union-attr]
    raise ValueError(f"unknown operator {op!r}")


def matches(predicates: list[Predicate], attributes: Mapping[str, object]) -> bool:
    """The reference semantics, against which the index is tested."""
    for key, op, target in predicates:
        if key not in attributes or not evaluate(op, target, attributes[key]):
            return False
    return True
