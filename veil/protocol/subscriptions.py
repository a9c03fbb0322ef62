"""The subscription language of SPEC §2.2 and the unsubscribe request of §2.3.

A subscription is a conjunction of predicates (key, op, value) with canonical operator names; the
types are checked against the operators here, satisfiability is the matcher's business.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from veil.protocol.errors import ProtocolError, load_json
from veil.protocol.values import Scalar, canonical_type, convert, type_of

MAX_ID_LENGTH = 256

OPERATORS = {
    "eq": "eq", "=": "eq", "==": "eq",
    "ne": "ne", "!=": "ne",
    "gt": "gt", ">": "gt",
    "lt": "lt", "<": "lt",
    "ge": "ge", ">=": "ge",
    "le": "le", "lq": "le", "<=": "le",
    "between": "between",
    "contains": "contains", "ss": "contains",
    "starts_with": "starts_with", "startswith": "starts_with",
    "ends_with": "ends_with", "endswith": "ends_with",
    "in": "in",
}  # fmt: skip
ORDERING = frozenset({"gt", "lt", "ge", "le", "between"})
TEXTUAL = frozenset({"contains", "starts_with", "ends_with"})
WILDCARD = "*"


MAX_K = 10_000
PREFERENCES = ("high", "low")


class TopK(NamedTuple):
    """The top-k/w part of a subscription (SPEC §5): the k best of a window of `window` ms, ranked by
    a weighted sum of terms (key, weight, target, prefer): |value - target|, or the value itself
    when `prefer` is "low" and its negation when "high"; lower sums rank better."""

    k: int
    window: float
    terms: list[tuple[str, float, float | None, str | None]]


class SubscribeRequest(NamedTuple):
    auth_hash: str | None  # what the client claims; the gateway decides whether that is proved
    subscription_id: str | None
    predicates: list[tuple[str, str, object]]
    topk: TopK | None = None


class UnsubscribeRequest(NamedTuple):
    auth_hash: str | None
    subscription_id: str


def parse_subscribe(raw: bytes) -> SubscribeRequest:
    doc = _object(raw)
    auth = auth_hash_of(doc)
    sub_id = doc.get("subscriptionId")
    if sub_id is not None:
        sub_id = subscription_id_of(doc, required=False)
    data = doc.get("data")
    if not isinstance(data, list):
        raise ProtocolError("data", "missing or not an array of constraints ([] matches everything)")
    predicates: list[tuple[str, str, object]] = []
    for i, item in enumerate(data):
        predicate = parse_predicate(item, f"data[{i}]")
        if predicate not in predicates:
            predicates.append(predicate)
    topk = doc.get("topk")
    return SubscribeRequest(auth, sub_id or None, predicates, None if topk is None else parse_topk(topk))


def parse_topk(doc: object) -> TopK:
    """`{"k": 3, "w": 60000, "score": [{"key": "NO2", "prefer": "high"}, {"key": "lat", "target": 45.8,
    "weight": 2}]}`: the window `w` in milliseconds."""
    if not isinstance(doc, dict):
        raise ProtocolError("topk", 'expected {"k": K, "w": MILLISECONDS, "score": [TERM, ...]}')
    k = doc.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ProtocolError("topk.k", f"an integer from 1 to {MAX_K}")
    window = doc.get("w")
    if not _number(window) or window <= 0:  # type: ignore[operator]
        raise ProtocolError("topk.w", "the window in milliseconds: a positive number")
    score = doc.get("score")
    if not isinstance(score, list) or not score:
        raise ProtocolError("topk.score", "a non-empty array of terms {key, target | prefer, weight}")
    return TopK(k, float(window), [_term(term, f"topk.score[{i}]") for i, term in enumerate(score)])  # type: ignore[arg-type]


def _term(item: object, where: str) -> tuple[str, float, float | None, str | None]:
    if not isinstance(item, dict):
        raise ProtocolError(where, "each term is an object {key, target | prefer, weight}")
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise ProtocolError(f"{where}.key", "missing or not a non-empty string")
    weight = item.get("weight", 1)
    if not _number(weight) or weight <= 0:
        raise ProtocolError(f"{where}.weight", "a positive number")
    target, prefer = item.get("target"), item.get("prefer")
    if (target is None) == (prefer is None):
        raise ProtocolError(where, "give either a target (rank by distance to it) or prefer: high | low")
    if target is not None and not _number(target):
        raise ProtocolError(f"{where}.target", "a number")
    if prefer is not None and prefer not in PREFERENCES:
        raise ProtocolError(f"{where}.prefer", "high or low")
    return (key, float(weight), None if target is None else float(target), prefer)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_unsubscribe(raw: bytes) -> UnsubscribeRequest:
    doc = _object(raw)
    return UnsubscribeRequest(auth_hash_of(doc), subscription_id_of(doc, required=True))


def auth_hash_of(doc: dict) -> str | None:
    """The authHash a request names, if any (a client certificate or a token may prove it instead)."""
    auth = doc.get("authHash")
    if auth is not None and (not isinstance(auth, str) or not auth):
        raise ProtocolError("authHash", "not a non-empty string")
    return auth


def subscription_id_of(doc: dict, required: bool) -> str:
    sub_id = doc.get("subscriptionId")
    if sub_id is None or sub_id == "":
        if required:
            raise ProtocolError("subscriptionId", "missing")
        return ""
    if not isinstance(sub_id, str):
        raise ProtocolError("subscriptionId", "not a string")
    if len(sub_id) > MAX_ID_LENGTH or not sub_id.isprintable():
        raise ProtocolError("subscriptionId", f"at most {MAX_ID_LENGTH} printable characters")
    return sub_id


def parse_predicate(item: object, where: str) -> tuple[str, str, object]:
    if not isinstance(item, dict):
        raise ProtocolError(where, "each constraint is an object {key, val, type, op}")
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise ProtocolError(f"{where}.key", "missing or not a non-empty string")
    op_name = item.get("op", "eq")
    if not isinstance(op_name, str) or op_name.lower() not in OPERATORS:
        raise ProtocolError(f"{where}.op", f"unknown operator {op_name!r}; use one of {sorted(set(OPERATORS))}")
    op = OPERATORS[op_name.lower()]
    value = item.get("val", item.get("value"))
    declared = item.get("type")
    type_name = canonical_type(declared, f"{where}.type") if declared is not None else None
    if op == "eq" and value == WILDCARD:
        return (key, "exists", None)
    if op in ("between", "in"):
        return (key, op, _list_value(op, value, type_name, where))
    scalar = _scalar(value, type_name, f"{where}.val")
    _check_operator(op, type_of(scalar), where)
    return (key, op, scalar)


def _list_value(op: str, value: object, type_name: str | None, where: str) -> list[Scalar]:
    if not isinstance(value, list) or not value or (op == "between" and len(value) != 2):
        shape = "[low, high]" if op == "between" else "a non-empty array of values"
        raise ProtocolError(f"{where}.val", f"operator {op!r} takes {shape}")
    items = [_scalar(v, type_name, f"{where}.val[{i}]") for i, v in enumerate(value)]
    classes = {_class(type_of(v)) for v in items}
    if len(classes) > 1:
        raise ProtocolError(f"{where}.val", f"operator {op!r} needs values of one type, got {sorted(classes)}")
    _check_operator(op, type_of(items[0]), where)
    if op == "in":
        unique: list[Scalar] = []
        for v in items:
            if v not in unique:
                unique.append(v)
        return unique
    return items


def _scalar(value: object, type_name: str | None, field: str) -> Scalar:
    if value is None:
        raise ProtocolError(field, "missing or null")
    if type_name is not None:
        return convert(value, type_name, field)
    if type_of(value) is None:
        raise ProtocolError(field, "must be an int, float, boolean or string")
    return value  # type: ignore[return-value]


def _class(type_name: str | None) -> str:
    return "number" if type_name in ("int", "float") else str(type_name)


def _check_operator(op: str, type_name: str | None, where: str) -> None:
    if type_name == "boolean" and (op in ORDERING or op in TEXTUAL):
        raise ProtocolError(f"{where}.op", f"operator {op!r} does not apply to booleans (use eq, ne or in)")
    if op in TEXTUAL and type_name != "string":
        raise ProtocolError(f"{where}.op", f"operator {op!r} applies to strings only, not {type_name}")


def _object(raw: bytes) -> dict:
    doc = load_json(raw)
    if not isinstance(doc, dict):
        raise ProtocolError("body", "expected a JSON object")
    return doc
