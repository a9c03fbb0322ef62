"""How a subscription is kept in the event log: its predicates as a JSON array, or an object with
the predicates (a stateful subscription's Boolean filter) and what else it has: its `topk` document
(as the protocol validated it: the kind's spec, `veil.matching.kinds`), the scope it was made in and
whether its owner was admitted to that scope by the attributes of its credentials rather than by the
registry, and the moment from which it replays the retained log (`since`). Plain subscriptions keep
the bare array, the form the log has always held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from veil.matching.predicates import Predicate


class Stored(NamedTuple):
    predicates: list[Predicate]
    topk: dict[str, Any] | None = None  # a stateful subscription's spec, as /subscribe took it
    scope: str = ""  # "" for the world
    admitted: bool = False  # a member of its scope by its credentials' attributes
    since: int | None = None  # ms since the epoch: it receives the retained publications logged from then on


def encode_subscription(
    predicates: Sequence[Sequence[Any]], topk: Mapping[str, Any] | None = None, scope: str | None = None,
    admitted: bool = False, since: int | None = None,
) -> bytes:  # fmt: skip
    if topk is None and not scope and since is None:
        return orjson.dumps(predicates)
    doc: dict[str, object] = {"data": predicates}
    if topk is not None:
        doc["topk"] = topk
    if scope:
        doc["scope"] = scope
        doc["admitted"] = admitted
    if since is not None:
        doc["since"] = since
    return orjson.dumps(doc)


def decode_subscription(body: bytes) -> Stored:
    doc = orjson.loads(body)
    if isinstance(doc, list):
        return Stored([Predicate(*p) for p in doc])
    topk = doc.get("topk")
    if isinstance(topk, list):  # logged before kinds: [k, window, [[key, weight, target, prefer], ...]]
        k, window, terms = topk
        topk = {"k": k, "w": window, "score": [_term(*term) for term in terms]}
    return Stored(
        [Predicate(*p) for p in doc["data"]], topk, doc.get("scope", ""), doc.get("admitted", False), doc.get("since")
    )


def _term(key: str, weight: float, target: float | None, prefer: str | None) -> dict[str, Any]:
    return {"key": key, "weight": weight, **({"prefer": prefer} if target is None else {"target": target})}
