"""How a subscription is kept in the event log: its predicates as a JSON array, or, for a top-k/w
subscription, an object with the predicates (its Boolean filter) and the top-k/w part. Plain
subscriptions keep the bare array, the form the log has always held."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from veil.matching.predicates import Predicate
from veil.matching.topkw import Term, TopKW


def encode_subscription(predicates: Sequence[Sequence], topk: tuple | None = None) -> bytes:
    """`topk` is (k, window, terms) with terms (key, weight, target, prefer)."""
    if topk is None:
        return orjson.dumps(predicates)
    k, window, terms = topk
    return orjson.dumps({"data": predicates, "topk": [k, window, terms]})


def decode_subscription(body: bytes) -> tuple[list[Predicate], TopKW | None]:
    doc = orjson.loads(body)
    if isinstance(doc, list):
        return [Predicate(*p) for p in doc], None
    k, window, terms = doc["topk"]
    return [Predicate(*p) for p in doc["data"]], TopKW(k, window, tuple(Term(*t) for t in terms))
