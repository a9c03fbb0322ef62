"""The subscription language of SPEC §2.2 and the unsubscribe request of §2.3.

A subscription is a conjunction of predicates (key, op, value) with canonical operator names; the
types are checked against the operators here, satisfiability is the matcher's business.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, NamedTuple, TypeGuard

from veil.protocol.errors import ProtocolError
from veil.protocol.limits import DEFAULT, Limits, load_json
from veil.protocol.values import Scalar, canonical_type, convert, type_of
from veil.protocol.webhooks import WebhookRequest, parse_webhook

MAX_ID_LENGTH = 256
MAX_CREDENTIAL_LENGTH = 16 * 1024  # an authHash or a bearer token
MIN_WINDOW_MS = 1  # below a millisecond, `time + w == time` for the log's clock
MAX_TERM_VALUE = 1e15  # weights and targets: sums of terms stay far from overflow
MAX_LIMIT = 2**62  # of a queue limit: stores hold int64
LATEST_SINCE_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: the last moment RFC 3339 can name

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


PREFERENCES = ("high", "low")


class SubscribeRequest(NamedTuple):
    auth_hash: str | None  # what the client claims; the gateway decides whether that is proved
    subscription_id: str | None
    predicates: list[tuple[str, str, object]]
    topk: dict[str, Any] | None = None  # a stateful subscription's spec, canonical: `parse_topk`
    scope: str | None = None  # the scope it is made in; None for the world
    since: int | None = None  # replay the retained publications logged from then on (ms since the epoch)
    limits: QueueLimits | None = None  # the most its queue holds, by the subscriber (the operator's otherwise)
    webhook: WebhookRequest | None = None  # delivered by POSTs to this endpoint instead of a connection


class QueueLimits(NamedTuple):
    """What a subscriber asks its subscription's queue to hold at most (None: as much as the operator
    lets it): deliveries, bytes of their publications, milliseconds since they were published."""

    deliveries: int | None = None
    bytes: int | None = None
    age: int | None = None


class UnsubscribeRequest(NamedTuple):
    auth_hash: str | None
    subscription_id: str


def parse_subscribe(raw: bytes, limits: Limits = DEFAULT) -> SubscribeRequest:
    doc = load_object(raw, limits)
    auth = auth_hash_of(doc)
    sub_id = doc.get("subscriptionId")
    if sub_id is not None:
        sub_id = subscription_id_of(doc, required=False)
    predicates = parse_constraints(doc.get("data"), "data", limits)
    topk = doc.get("topk")
    scope = doc.get("scope")
    if scope is not None and (not isinstance(scope, str) or not 0 < len(scope) <= MAX_ID_LENGTH):
        raise ProtocolError("scope", f"the name of a scope: a non-empty string of at most {MAX_ID_LENGTH} characters")
    since = doc.get("since")
    if since is not None:
        if topk is not None:
            raise ProtocolError("since", "a top-k subscription ranks what is published from its start: no replay")
        since = parse_since(since)
    bounds = doc.get("limits")
    webhook = doc.get("webhook")
    return SubscribeRequest(
        auth, sub_id or None, predicates, None if topk is None else parse_topk(topk, limits), scope or None, since,
        None if bounds is None else parse_queue_limits(bounds), None if webhook is None else parse_webhook(webhook),
    )  # fmt: skip


def parse_queue_limits(doc: object) -> QueueLimits:
    """`{"deliveries": N, "bytes": N, "age": MILLISECONDS}`, any of them: positive integers."""
    if not isinstance(doc, dict) or not doc.keys() <= set(QueueLimits._fields):
        raise ProtocolError("limits", 'an object of any of {"deliveries": N, "bytes": N, "age": MILLISECONDS}')
    for name, value in doc.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
            raise ProtocolError(f"limits.{name}", f"a positive integer, at most {MAX_LIMIT}")
    return QueueLimits(**doc)


def parse_since(value: object, field: str = "since") -> int:
    """A moment as milliseconds since the epoch: given so, or as an RFC 3339 time with its offset
    (`2026-11-29T08:00:00Z`); a time without an offset would mean whatever the broker's zone is."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.upper())  # (RFC 3339 allows a lower-case t and z)
        except ValueError:
            raise ProtocolError(field, f"not an RFC 3339 time: {value[:64]!r}") from None
        if moment.utcoffset() is None:
            raise ProtocolError(field, "an RFC 3339 time needs its offset (Z or +HH:MM)")
        return _since_ms(moment.timestamp() * 1000, field)
    if isinstance(value, int) and not isinstance(value, bool):
        return _since_ms(value, field)
    raise ProtocolError(field, "milliseconds since the epoch (an integer) or an RFC 3339 time (a string)")


def _since_ms(ms: float, field: str) -> int:
    if not 0 <= ms <= LATEST_SINCE_MS:
        raise ProtocolError(field, "from the epoch (0) to the year 9999")
    return math.floor(ms)


def parse_constraints(data: object, field: str, limits: Limits = DEFAULT) -> list[tuple[str, str, object]]:
    """A conjunction of constraints, each once, in the order given (a set keeps de-duplication linear)."""
    if not isinstance(data, list):
        raise ProtocolError(field, "missing or not an array of constraints ([] matches everything)")
    if len(data) > limits.constraints:
        raise ProtocolError(field, f"{len(data)} constraints; at most {limits.constraints}", 413)
    predicates: dict[tuple[Any, ...], tuple[str, str, object]] = {}
    for i, item in enumerate(data):
        predicate = parse_predicate(item, f"{field}[{i}]", limits)
        predicates.setdefault(_identity(predicate), predicate)
    return list(predicates.values())


def _identity(predicate: tuple[str, str, object]) -> tuple[Any, ...]:
    """What makes two constraints the same: also the type of each value, since `1 == True == 1.0`."""
    key, op, value = predicate
    if isinstance(value, list):
        return (key, op, tuple((type(v), v) for v in value))
    return (key, op, type(value), value)


def parse_topk(doc: object, limits: Limits = DEFAULT) -> dict[str, Any]:
    """`{"k": 3, "w": 60000, "score": [{"key": "NO2", "prefer": "high"}, {"key": "lat", "target": 45.8,
    "weight": 2}]}`: the window `w` in milliseconds, or `"n": 100` instead, the last 100 matching
    publications. Returned canonical (every term with its weight, numbers as floats), the form the
    log keeps and the matcher's kinds read."""
    if not isinstance(doc, dict):
        raise ProtocolError("topk", 'expected {"k": K, "w": MILLISECONDS | "n": COUNT, "score": [TERM, ...]}')
    k = doc.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.k:
        raise ProtocolError("topk.k", f"an integer from 1 to {limits.k}")
    window, count = doc.get("w"), doc.get("n")
    if (window is None) == (count is None):
        raise ProtocolError("topk", "give either a window w (milliseconds) or a count n (publications)")
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= limits.window_count:
            raise ProtocolError("topk.n", f"the window as a count of publications: from 1 to {limits.window_count}")
        extent: dict[str, Any] = {"n": count}
    elif _number(window) and MIN_WINDOW_MS <= window <= limits.window_ms:
        extent = {"w": float(window)}
    else:
        raise ProtocolError("topk.w", f"the window in milliseconds: from {MIN_WINDOW_MS} to {limits.window_ms}")
    score = doc.get("score")
    if not isinstance(score, list) or not score or len(score) > limits.constraints:
        raise ProtocolError(
            "topk.score", f"a non-empty array of at most {limits.constraints} terms {{key, target | prefer, weight}}"
        )
    return {"k": k, **extent, "score": [_term(term, f"topk.score[{i}]") for i, term in enumerate(score)]}


def _term(item: object, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ProtocolError(where, "each term is an object {key, target | prefer, weight}")
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise ProtocolError(f"{where}.key", "missing or not a non-empty string")
    weight = item.get("weight", 1)
    if not _number(weight) or not 0 < weight <= MAX_TERM_VALUE:
        raise ProtocolError(f"{where}.weight", f"a positive number up to {MAX_TERM_VALUE:g}")
    target, prefer = item.get("target"), item.get("prefer")
    if (target is None) == (prefer is None):
        raise ProtocolError(where, "give either a target (rank by distance to it) or prefer: high | low")
    if target is not None and (not _number(target) or abs(target) > MAX_TERM_VALUE):
        raise ProtocolError(f"{where}.target", f"a number from {-MAX_TERM_VALUE:g} to {MAX_TERM_VALUE:g}")
    if prefer is not None and prefer not in PREFERENCES:
        raise ProtocolError(f"{where}.prefer", "high or low")
    ranking = {"prefer": prefer} if target is None else {"target": float(target)}
    return {"key": key, "weight": float(weight), **ranking}


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_unsubscribe(raw: bytes, limits: Limits = DEFAULT) -> UnsubscribeRequest:
    doc = load_object(raw, limits)
    return UnsubscribeRequest(auth_hash_of(doc), subscription_id_of(doc, required=True))


def auth_hash_of(doc: dict[str, Any]) -> str | None:
    """The authHash a request names, if any (a client certificate or a token may prove it instead)."""
    auth = doc.get("authHash")
    if auth is not None and (not isinstance(auth, str) or not auth or len(auth) > MAX_CREDENTIAL_LENGTH):
        raise ProtocolError("authHash", f"not a non-empty string of at most {MAX_CREDENTIAL_LENGTH} characters")
    return auth


def subscription_id_of(doc: dict[str, Any], required: bool) -> str:
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


def parse_predicate(item: object, where: str, limits: Limits = DEFAULT) -> tuple[str, str, object]:
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
        return (key, op, _list_value(op, value, type_name, where, limits))
    scalar = _scalar(value, type_name, f"{where}.val")
    _check_operator(op, type_of(scalar), where)
    return (key, op, scalar)


def _list_value(op: str, value: object, type_name: str | None, where: str, limits: Limits) -> list[Scalar]:
    if not isinstance(value, list) or not value or (op == "between" and len(value) != 2):
        shape = "[low, high]" if op == "between" else "a non-empty array of values"
        raise ProtocolError(f"{where}.val", f"operator {op!r} takes {shape}")
    if len(value) > limits.in_values:
        raise ProtocolError(f"{where}.val", f"{len(value)} values; at most {limits.in_values}", 413)
    items = [_scalar(v, type_name, f"{where}.val[{i}]") for i, v in enumerate(value)]
    classes = {_class(type_of(v)) for v in items}
    if len(classes) > 1:
        raise ProtocolError(f"{where}.val", f"operator {op!r} needs values of one type, got {sorted(classes)}")
    _check_operator(op, type_of(items[0]), where)
    if op == "in":  # one class of values: equal ones are the same value (1 and 1.0 alike)
        return list(dict.fromkeys(items))
    return items


def _scalar(value: object, type_name: str | None, field: str) -> Scalar:
    if value is None:
        raise ProtocolError(field, "missing or null")
    if type_name is not None:
        return convert(value, type_name, field)
    if type_of(value) is None:
        raise ProtocolError(field, "must be an int, float, boolean or string")
    return value  # type: ignore[return-value]  # type_of said it is a Scalar


def _class(type_name: str | None) -> str:
    return "number" if type_name in ("int", "float") else str(type_name)


def _check_operator(op: str, type_name: str | None, where: str) -> None:
    if type_name == "boolean" and (op in ORDERING or op in TEXTUAL):
        raise ProtocolError(f"{where}.op", f"operator {op!r} does not apply to booleans (use eq, ne or in)")
    if op in TEXTUAL and type_name != "string":
        raise ProtocolError(f"{where}.op", f"operator {op!r} applies to strings only, not {type_name}")


def load_object(raw: bytes, limits: Limits = DEFAULT) -> dict[str, Any]:
    doc = load_json(raw, "body", limits)
    if not isinstance(doc, dict):
        raise ProtocolError("body", "expected a JSON object")
    return doc
