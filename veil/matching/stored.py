"""How a subscription is kept in the event log: its predicates as a JSON array, or an object with
the predicates (a top-k/w subscription's Boolean filter) and what else it has: the top-k/w part,
the scope it was made in and whether its owner was admitted to that scope by the attributes of its
credentials rather than by the registry. Plain subscriptions keep the bare array, the form the log
has always held."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

from veil.matching.predicates import Predicate
from veil.matching.topkw import Term, TopKW


class Stored(NamedTuple):
    predicates: list[Predicate]
    topk: TopKW | None = None
    scope: str = ""  # "" for the world
    admitted: bool = False  # a member of its scope by its credentials' attributes


def encode_subscription(
    predicates: Sequence[Sequence], topk: tuple | None = None, scope: str | None = None, admitted: bool = False
) -> bytes:
    """`topk` is (k, window, terms) with terms (key, weight, target, prefer)."""
    if topk is None and not scope:
        return orjson.dumps(predicates)
    doc: dict[str, object] = {"data": predicates}
    if topk is not None:
        k, window, terms = topk
        doc["topk"] = [k, window, terms]
    if scope:
        doc["scope"] = scope
        doc["admitted"] = admitted
    return orjson.dumps(doc)


def decode_subscription(body: bytes) -> Stored:
    doc = orjson.loads(body)
    if isinstance(doc, list):
        return Stored([Predicate(*p) for p in doc])
    topk = doc.get("topk")
    if topk is not None:
        k, window, terms = topk
        topk = TopKW(k, window, tuple(Term(*t) for t in terms))
    return Stored([Predicate(*p) for p in doc["data"]], topk, doc.get("scope", ""), doc.get("admitted", False))
