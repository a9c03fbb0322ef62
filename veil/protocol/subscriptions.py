"""The subscription language of SPEC §2.2 and the unsubscribe request of §2.3.

A subscription is a conjunction of predicates (key, op, value) with canonical operator names; the
types are checked against the operators here, satisfiability is the matcher's business.
"""

from __future__ import annotations

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


class SubscribeRequest(NamedTuple):
    auth_hash: str | None  # what the client claims; the gateway decides whether that is proved
    subscription_id: str | None
    predicates: list[tuple[str, str, object]]


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
    return SubscribeRequest(auth, sub_id or None, predicates)


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
