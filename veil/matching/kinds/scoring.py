"""The reference scoring of ranked kinds (SPEC §5): a weighted sum of terms, lower is better.

Each term is the distance of a key's value to a target, or the value itself when the subscriber
prefers it low (its negation when high). A publication a term cannot read (the key missing, or not a
finite number) cannot be ranked: it does not enter the subscription's window at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from veil.matching.kinds.base import Arrivals, NumericColumns


class Term(NamedTuple):
    """One scoring term: the distance of `key`'s value to `target`, or the value itself when
    `prefer` is "low" (its negation when "high"), times `weight`."""

    key: str
    weight: float = 1.0
    target: float | None = None
    prefer: str | None = None


def terms_of(doc: Mapping[str, Any]) -> tuple[Term, ...]:
    """The terms of a `topk` document's `score` (as the protocol validated them)."""
    return tuple(
        Term(term["key"], float(term.get("weight", 1.0)), term.get("target"), term.get("prefer"))
        for term in doc["score"]
    )


def score(terms: Iterable[Term], attributes: Mapping[str, object]) -> float | None:
    """Weighted sum of the terms; None when a term's key is missing or not a finite number."""
    total = 0.0
    for key, weight, target, prefer in terms:
        value = attributes.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        if target is not None:
            total += weight * abs(value - target)
        elif prefer == "high":
            total -= weight * value
        else:
            total += weight * value
    return total


def score_many(terms: Iterable[Term], columns: NumericColumns, positions: np.ndarray) -> np.ndarray:
    """`score` of the documents at these positions; NaN for those that cannot be ranked."""
    total = np.zeros(len(positions), np.float64)
    for key, weight, target, prefer in terms:
        values = columns[key][positions]
        if target is not None:
            total += weight * np.abs(values - target)
        elif prefer == "high":
            total -= weight * values
        else:
            total += weight * values
    return total


def ranked(terms: Iterable[Term], arrivals: Arrivals) -> tuple[list[int], list[float], np.ndarray]:
    """The arrivals that can be ranked, with their scores: (seqs, times, scores)."""
    terms = tuple(terms)
    scores = score_many(terms, arrivals.columns, arrivals.positions)
    for i, document in arrivals.replaced.items():
        value = score(terms, document)
        scores[i] = math.nan if value is None else value
    rankable = np.flatnonzero(~np.isnan(scores))
    if len(rankable) == len(scores):
        return arrivals.seqs, arrivals.times, scores
    keep = rankable.tolist()
    return [arrivals.seqs[i] for i in keep], [arrivals.times[i] for i in keep], scores[rankable]
