"""The subscription index: access predicates and vectorised verification, for batches of publications.

Every subscription is filed under one *access predicate*, the one most likely to be selective:
an equality (hash bucket), an `in` list (one bucket per value), a prefix, a range bound (sorted numpy
arrays, one per key and operator), or, failing those, the mere presence of a key. A batch of
publications turns into (publication, subscription) candidate pairs through hash look-ups and
`searchsorted` slices, so a publication never touches a subscription whose access predicate it does
not satisfy. The candidates' predicates are then verified at once with numpy over a columnar
predicate table. This is the counting algorithm's idea (only satisfied predicates cost) with the
count replaced by a vectorised check, which is what makes batches fast in Python.

Updates are incremental: new range bounds wait in a list until the next match inserts them into
the sorted arrays at once; removed subscriptions are tombstoned and the structures are rebuilt once
tombstones outnumber the living. Numbers compare as float64; the rare integers beyond 2**53, which float64 cannot hold
exactly, are matched by the reference semantics instead.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from veil.matching.predicates import Predicate, matches, value_class

NUMBER, STRING, BOOL = 0, 1, 2
CLASS_CODES = {"number": NUMBER, "string": STRING, "bool": BOOL}
EQ, NE, GT, GE, LT, LE, BETWEEN, IN, CONTAINS, STARTS_WITH, ENDS_WITH, EXISTS = range(12)
OP_CODES = {
    "eq": EQ, "ne": NE, "gt": GT, "ge": GE, "lt": LT, "le": LE, "between": BETWEEN, "in": IN,
    "contains": CONTAINS, "starts_with": STARTS_WITH, "ends_with": ENDS_WITH, "exists": EXISTS,
}  # fmt: skip
CHECK_INTERVAL, CHECK_TOKEN, CHECK_PRESENT, CHECK_PYTHON = range(4)
ACCESS_SHARE = {"starts_with": 0.25, "between": 0.25, "gt": 0.5, "ge": 0.5, "lt": 0.5, "le": 0.5}
_CLASS_OF_TYPE = {bool: BOOL, int: NUMBER, float: NUMBER, str: STRING}
PREDICATE_ROW = np.dtype(
    [("key", np.int32), ("kind", np.int8), ("cls", np.int8), ("negate", np.bool_), ("token", np.int32),
     ("low", np.float64), ("high", np.float64)]
)  # fmt: skip
EXACT_LIMIT = 2**53
CHUNK_PAIRS = 1 << 20
VERIFY_STAGES = (4, 12, 28, np.iinfo(np.int64).max)  # predicate positions where pairs are dropped


def _class_code(value: object) -> int:
    return CLASS_CODES[value_class(value)]


def _exact(value: object) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or -EXACT_LIMIT <= value <= EXACT_LIMIT


class _Column:
    """An append-only numpy column with amortised O(1) appends."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.data: np.ndarray = np.empty(256, dtype)
        self.size = 0

    def append(self, value: object) -> None:
        if self.size == len(self.data):
            self.data = np.concatenate([self.data, np.empty(len(self.data), self.data.dtype)])
        self.data[self.size] = value
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.size]


class _Bounds:
    """Range bounds of one (key, operator, class): sorted arrays, and the bounds added since the last
    match, merged in by the next one. A match against unmerged bounds compared every publication
    with each of them (up to 512, or a sixteenth of the sorted ones, per key and operator, until more
    came): on the CUPUS load at 20,000 subscriptions, about 4 % of a matcher's samples, for no pair
    it would not otherwise find."""

    def __init__(self, op: int, dtype: type) -> None:
        self.op = op
        self.dtype = dtype
        self.values: np.ndarray = np.empty(0, dtype)
        self.slots: np.ndarray = np.empty(0, np.int64)
        self.new_values: list[Any] = []
        self.new_slots: list[int] = []

    def add(self, value: object, slot: int) -> None:
        self.new_values.append(value)
        self.new_slots.append(slot)

    def _merge(self) -> None:
        """One insert of the sorted new bounds: the cost of a copy, not of sorting all again."""
        fresh: np.ndarray = np.array(self.new_values, self.dtype)
        order = np.argsort(fresh, kind="stable")
        at = np.searchsorted(self.values, fresh[order], "right")
        self.values = np.insert(self.values, at, fresh[order])
        self.slots = np.insert(self.slots, at, np.array(self.new_slots, np.int64)[order])
        self.new_values, self.new_slots = [], []

    def candidates(self, pubs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(publication, slot) pairs whose bound the publication's value satisfies."""
        if self.new_values:
            self._merge()
        bound = self.values
        if self.op in (GT, GE, BETWEEN):  # bound below the value: a prefix of the sorted bounds
            ends = np.searchsorted(bound, values, "left" if self.op == GT else "right")
            starts = np.zeros_like(ends)
        else:  # bound above the value: a suffix
            starts = np.searchsorted(bound, values, "right" if self.op == LT else "left")
            ends = np.full_like(starts, len(bound))
        counts = ends - starts
        total = int(counts.sum())
        offsets = np.cumsum(counts) - counts
        picks = np.repeat(starts - offsets, counts) + np.arange(total)
        return np.repeat(pubs, counts), self.slots[picks]


class SubscriptionIndex:
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._slots: dict[str, int] = {}
        self._sub_ids: list[str | None] = []
        self._predicates: list[list[Predicate] | None] = []
        self._alive = _Column(np.bool_)
        self._number = _Column(np.int64)
        self._start = _Column(np.int64)
        self._length = _Column(np.int64)
        # 1 where the slot's first table row is its access predicate and every candidate pair its
        # access structure yields satisfies it: verification starts a row later
        self._implied = _Column(np.int64)
        self._dead = 0
        # the predicate table, one row per predicate of every subscription ever filed; `kind` says how
        # a row is checked: as a numeric interval [low, high] (exclusive bounds moved one float step
        # inwards; `ne` negated), as an interned token compared for (in)equality, as a presence
        # test, or in Python for the rest (string order, `in`, substring operators)
        self._table = _Column(PREDICATE_ROW)
        self._op: list[int] = []
        self._obj: list[object] = []
        self._obj2: list[object] = []
        self._tokens: dict[tuple[int, object], int] = {}
        self._key_ids: dict[str, int] = {}
        # access structures
        self._equal: dict[int, dict[tuple[int, object], list[int]]] = defaultdict(dict)
        self._prefix: dict[int, dict[str, list[int]]] = defaultdict(dict)
        self._prefix_lengths: dict[int, set[int]] = defaultdict(set)
        self._bounds: dict[tuple[int, int, int], _Bounds] = {}
        self._present: dict[int, list[int]] = defaultdict(list)
        self._everything: list[int] = []
        self._inexact: list[int] = []

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._slots

    # --- updates ----------------------------------------------------------------------------
    def add(self, sub_id: str, predicates: Iterable[Sequence[Any]], number: int = -1) -> None:
        """Store a subscription; an existing one with the same id is replaced. `number` is the caller's
        integer name for it, which `numbers` returns for slots without a Python object per match."""
        self.remove(sub_id)
        stored = [Predicate(*p) for p in predicates]
        slot = len(self._sub_ids)
        self._slots[sub_id] = slot
        self._sub_ids.append(sub_id)
        self._predicates.append(stored)
        self._alive.append(True)
        self._number.append(number)
        self._file(slot, stored)

    def number_of(self, sub_id: str) -> int | None:
        """The number a stored subscription was added with (None: not stored)."""
        slot = self._slots.get(sub_id)
        return None if slot is None else int(self._number.data[slot])

    def remove(self, sub_id: str) -> None:
        slot = self._slots.pop(sub_id, None)
        if slot is None:
            return
        self._alive.data[slot] = False
        self._sub_ids[slot] = None
        self._predicates[slot] = None
        self._dead += 1
        if self._dead > max(1024, len(self._slots)):
            self._rebuild()

    def _rebuild(self) -> None:
        live = [
            (s, p, n)
            for s, p, n in zip(self._sub_ids, self._predicates, self._number.view.tolist(), strict=True)
            if s is not None and p is not None
        ]
        self._clear()
        for sub_id, predicates, number in live:
            self.add(sub_id, predicates, number)

    def _file(self, slot: int, predicates: list[Predicate]) -> None:
        for predicate in predicates:
            self._key_ids.setdefault(predicate.key, len(self._key_ids))
        exact = all(_exact(v) for p in predicates for v in (p.value if p.op in ("in", "between") else (p.value,)))
        access = self._access(predicates) if predicates and exact else None
        self._start.append(len(self._op))
        self._length.append(len(predicates))
        self._implied.append(int(access is not None and _implied(access)))
        for key, op, value in sorted(predicates, key=lambda p: p is not access):  # the access predicate first
            self._append_predicate(key, op, value)
        if access is None:
            (self._inexact if predicates else self._everything).append(slot)
            return
        key, op, value = access
        key_id = self._key_ids[key]
        if op == "eq":
            self._equal[key_id].setdefault((_class_code(value), value), []).append(slot)
        elif op == "in":
            for v in value:
                self._equal[key_id].setdefault((_class_code(v), v), []).append(slot)
        elif op == "starts_with":
            self._prefix[key_id].setdefault(value, []).append(slot)
            self._prefix_lengths[key_id].add(len(value))
        elif op in ("gt", "ge", "lt", "le", "between"):
            bound = value[0] if op == "between" else value
            cls = _class_code(bound)
            code = OP_CODES[op]
            bounds = self._bounds.get((key_id, code, cls))
            if bounds is None:
                bounds = self._bounds[(key_id, code, cls)] = _Bounds(code, np.float64 if cls == NUMBER else object)
            bounds.add(bound, slot)
        else:
            self._present[key_id].append(slot)

    def _access(self, predicates: list[Predicate]) -> Predicate:
        """The predicate expected to let the fewest publications through. An equality on a key lets
        through about one publication in as many as the key has distinct filed values; a range about
        half, a `between` a quarter, a prefix a quarter; the presence of a key is the last resort."""
        best, best_share = predicates[0], 2.0
        for predicate in predicates:
            op = predicate.op
            if op in ("eq", "in"):
                distinct = len(self._equal.get(self._key_ids[predicate.key], ()))
                share = (len(predicate.value) if op == "in" else 1) / (distinct + 1)
            else:
                share = ACCESS_SHARE.get(op, 1.0)
            if share < best_share:
                best, best_share = predicate, share
        return best

    def _append_predicate(self, key: str, op: str, value: Any) -> None:
        key_id = self._key_ids.setdefault(key, len(self._key_ids))
        code = OP_CODES[op]
        first = value[0] if op in ("between", "in") else value
        second = value[1] if op == "between" else None
        cls = -1 if op == "exists" else _class_code(first)
        low, high, token, kind = -np.inf, np.inf, -1, CHECK_PYTHON
        if op == "exists":
            kind = CHECK_PRESENT
        elif cls == NUMBER and code in (EQ, NE, GT, GE, LT, LE, BETWEEN) and _exact(first) and _exact(second):
            kind = CHECK_INTERVAL
            t = float(first)
            if code in (EQ, NE):
                low = high = t
            elif code in (GT, GE):
                low = np.nextafter(t, np.inf) if code == GT else t
            elif code in (LT, LE):
                high = np.nextafter(t, -np.inf) if code == LT else t
            else:
                assert second is not None  # between has two bounds
                low, high = t, float(second)
        elif cls in (STRING, BOOL) and code in (EQ, NE):
            kind = CHECK_TOKEN
            token = self._tokens.setdefault((cls, first), len(self._tokens))
        self._table.append((key_id, kind, cls, code == NE, token, low, high))
        self._op.append(code)
        self._obj.append(frozenset(value) if op == "in" else first)
        self._obj2.append(second)

    # --- matching ---------------------------------------------------------------------------
    def match(self, attributes: Mapping[str, object]) -> list[str]:
        return self.match_batch([attributes])[0]

    def match_batch(self, publications: Sequence[Mapping[str, object]]) -> list[list[str]]:
        """The ids of the subscriptions each publication matches, in the order of the batch."""
        out: list[list[str]] = [[] for _ in publications]
        pubs, slots = self.match_pairs(publications)
        sub_ids = self._sub_ids
        for pub, slot in zip(pubs.tolist(), slots.tolist(), strict=True):
            out[pub].append(sub_ids[slot])
        return out

    def match_pairs(self, publications: Sequence[Mapping[str, object]]) -> tuple[np.ndarray, np.ndarray]:
        """All (publication position, subscription slot) matches of a batch; `sub_id(slot)` names them."""
        batch = _Batch(publications, self._key_ids, self._tokens)
        pair_pubs, pair_slots = self._candidates(batch)
        if self._dead:  # tombstones since the last rebuild
            keep = self._alive.view[pair_slots]
            pair_pubs, pair_slots = pair_pubs[keep], pair_slots[keep]
        found_pubs, found_slots = [], []
        for low in range(0, len(pair_pubs), CHUNK_PAIRS):
            p, s = pair_pubs[low : low + CHUNK_PAIRS], pair_slots[low : low + CHUNK_PAIRS]
            ok = self._verify(batch, p, s)
            found_pubs.append(p[ok])
            found_slots.append(s[ok])
        everything = np.array([s for s in self._everything if self._sub_ids[s] is not None], np.int64)
        found_pubs.append(np.repeat(batch.exact_pubs, len(everything)))
        found_slots.append(np.tile(everything, len(batch.exact_pubs)))
        if self._inexact or batch.inexact_pubs:
            exact_pubs, exact_slots = self._by_reference(publications, batch)
            found_pubs.append(np.array(exact_pubs, np.int64))
            found_slots.append(np.array(exact_slots, np.int64))
        return np.concatenate(found_pubs), np.concatenate(found_slots)

    def sub_id(self, slot: int) -> str:
        """The id of a live slot (a slot's id goes when its subscription is removed)."""
        sub_id = self._sub_ids[slot]
        assert sub_id is not None, f"slot {slot} is not live"
        return sub_id

    def numbers(self, slots: np.ndarray) -> np.ndarray:
        numbers: np.ndarray = self._number.view[slots]
        return numbers

    def _candidates(self, batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
        pubs: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        equal_pubs: list[int] = []
        equal_slots: list[int] = []
        for pub, key_id, cls, value in batch.items:
            bucket = self._equal.get(key_id)
            if bucket is not None:
                found = bucket.get((cls, value))
                if found:
                    equal_pubs.extend([pub] * len(found))
                    equal_slots.extend(found)
            present = self._present.get(key_id)
            if present:
                equal_pubs.extend([pub] * len(present))
                equal_slots.extend(present)
            if cls == STRING and key_id in self._prefix:
                prefixes = self._prefix[key_id]
                for length in self._prefix_lengths[key_id]:
                    found = prefixes.get(value[:length]) if length <= len(value) else None
                    if found:
                        equal_pubs.extend([pub] * len(found))
                        equal_slots.extend(found)
        pubs.append(np.array(equal_pubs, np.int64))
        slots.append(np.array(equal_slots, np.int64))
        for (key_id, _, cls), bounds in self._bounds.items():
            found_pubs, values = batch.values_of(key_id, cls)
            if len(found_pubs):
                p, s = bounds.candidates(found_pubs, values)
                pubs.append(p)
                slots.append(s)
        return np.concatenate(pubs), np.concatenate(slots)

    def _verify(self, batch: _Batch, pair_pubs: np.ndarray, pair_slots: np.ndarray) -> np.ndarray:
        """Check the candidate pairs' predicates in stages of growing width, dropping a pair at its
        first failed stage: long subscriptions whose early predicates fail (the usual case) cost a few
        checks instead of all of theirs, while short ones are still checked in one pass. An access
        predicate its candidates imply is not checked again (on the CUPUS load, over a third of the
        rows checked, and every row of a single-predicate subscription's pairs)."""
        implied = self._implied.view.take(pair_slots)
        lengths = self._length.view.take(pair_slots) - implied
        starts = self._start.view.take(pair_slots) + implied
        result = self._check(batch, pair_pubs, starts, np.minimum(lengths, VERIFY_STAGES[0]))
        alive = np.nonzero(result & (lengths > VERIFY_STAGES[0]))[0]
        for low, high in itertools.pairwise(VERIFY_STAGES):
            if not len(alive):
                break
            width = np.minimum(lengths[alive] - low, high - low)
            ok = self._check(batch, pair_pubs[alive], starts[alive] + low, width)
            result[alive[~ok]] = False
            alive = alive[ok & (lengths[alive] > high)]
        return result

    def _check(self, batch: _Batch, pubs: np.ndarray, first_rows: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """Whether each pair's `widths` predicates from table row `first_rows` on all hold (a pair of
        width 0 holds). Pairs of one width are checked together as a matrix, a row per pair:
        spreading each pair's fields over its predicates (`np.repeat`) and reducing ragged runs cost
        more than the checks themselves."""
        counts = np.bincount(widths)
        present = np.flatnonzero(counts)
        if len(present) == 1:
            return self._check_width(batch, pubs, first_rows, int(present[0]))
        result = np.empty(len(pubs), bool)
        if len(present) <= VERIFY_STAGES[0]:  # a scan a width while they are few (the first stage's)
            groups = [np.flatnonzero(widths == width) for width in present.tolist()]
        else:  # else one sort (a radix sort of 16-bit keys, where they fit)
            keys = widths.astype(np.uint16) if present[-1] < 1 << 16 else widths
            groups = np.split(np.argsort(keys, kind="stable"), np.cumsum(counts[present])[:-1])
        for width, group in zip(present.tolist(), groups, strict=True):
            result[group] = self._check_width(batch, pubs[group], first_rows[group], width)
        return result

    def _check_width(self, batch: _Batch, pubs: np.ndarray, first_rows: np.ndarray, width: int) -> np.ndarray:
        """Whether each pair's `width` predicates from table row `first_rows` on all hold."""
        if not width:
            return np.ones(len(pubs), bool)
        rows = first_rows[:, None] + np.arange(width)
        table = self._table.view.take(rows)  # one gather of whole rows: one cache miss per predicate
        # one flat index into the batch matrices per predicate; absent keys land in the empty column
        cells = (pubs * batch.width)[:, None] + batch.column_of.take(table["key"])
        pub_classes = batch.classes.take(cells)
        kinds = table["kind"]
        same = pub_classes == table["cls"]
        numbers = batch.numbers.take(cells)
        ok = (numbers >= table["low"]) & (numbers <= table["high"])
        mixed = bool((kinds != CHECK_INTERVAL).any())
        if mixed:
            ok = np.where(kinds == CHECK_INTERVAL, ok, batch.tokens.take(cells) == table["token"])
        ok ^= table["negate"]
        ok &= same
        if mixed:
            ok = np.where(kinds == CHECK_PRESENT, pub_classes >= 0, ok)
            slow = np.nonzero((kinds == CHECK_PYTHON) & same)
            if len(slow[0]):
                ok[slow] = [
                    _holds(self._op[row], self._obj[row], self._obj2[row], batch.value_at(cell))
                    for row, cell in zip(rows[slow].tolist(), cells[slow].tolist(), strict=True)
                ]
        held: np.ndarray = np.logical_and.reduce(ok, axis=1)
        return held

    def _by_reference(self, publications: Sequence[Mapping[str, object]], batch: _Batch) -> tuple[list[int], list[int]]:
        """Values float64 cannot hold exactly: the reference semantics, subscription by subscription."""
        pubs: list[int] = []
        slots: list[int] = []
        inexact_subs = [s for s in self._inexact if self._sub_ids[s] is not None]
        for pub in range(len(publications)):
            if pub in batch.inexact_pubs:
                candidates = [s for s, p in enumerate(self._predicates) if p is not None]
            else:
                candidates = inexact_subs
            for slot in candidates:
                predicates = self._predicates[slot]
                if predicates is not None and matches(predicates, publications[pub]):
                    pubs.append(pub)
                    slots.append(slot)
        return pubs, slots


def _implied(access: Predicate) -> bool:
    """Whether every candidate pair of a subscription filed under `access` satisfies it: buckets
    hold values equal by class and value (an `in` list of one class: the table checks the first's),
    a prefix its strings, presence any value, and numeric bounds compare in float64 as the table's
    intervals do. A `between` is filed under its lower bound alone, a fallback under presence, and
    ordered strings and booleans compare in Python: those are checked."""
    op, value = access.op, access.value
    if op in ("eq", "starts_with", "exists"):
        return True
    if op == "in":
        return len({_class_code(v) for v in value}) == 1
    return op in ("gt", "ge", "lt", "le") and _class_code(value) == NUMBER


def _holds(op: int, target: Any, second: Any, value: Any) -> bool:
    """A check the columns cannot make (text operators, `in` over strings): JSON values of one class."""
    if op == EQ:
        return bool(value == target)
    if op == NE:
        return bool(value != target)
    if op == GT:
        return bool(value > target)
    if op == GE:
        return bool(value >= target)
    if op == LT:
        return bool(value < target)
    if op == LE:
        return bool(value <= target)
    if op == BETWEEN:
        return bool(target <= value <= second)
    if op == IN:
        return value in target
    if op == CONTAINS:
        return target in value
    if op == STARTS_WITH:
        return bool(value.startswith(target))
    return bool(value.endswith(target))


class _Batch:
    """A batch of publications as dense matrices over the keys the index knows, plus one empty column
    where keys a publication lacks point to."""

    def __init__(
        self,
        publications: Sequence[Mapping[str, object]],
        key_ids: dict[str, int],
        tokens: dict[tuple[int, object], int],
    ) -> None:
        self.items: list[tuple[int, int, int, Any]] = []  # (publication, key, class, JSON value)
        self.inexact_pubs: set[int] = set()
        columns: dict[int, int] = {}
        by_key: dict[tuple[int, int], tuple[list[int], list[object]]] = {}
        cells: list[int] = []
        classes: list[int] = []
        class_of = _CLASS_OF_TYPE
        for pub, attributes in enumerate(publications):
            for key, value in attributes.items():
                key_id = key_ids.get(key)
                if key_id is None:
                    continue
                cls = class_of[type(value)]
                if cls == NUMBER and type(value) is int and not -EXACT_LIMIT <= value <= EXACT_LIMIT:
                    self.inexact_pubs.add(pub)
                column = columns.get(key_id)
                if column is None:
                    column = columns[key_id] = len(columns)
                self.items.append((pub, key_id, cls, value))
                cells.append(column)
                classes.append(cls)
                found = by_key.get((key_id, cls))
                if found is None:
                    found = by_key[(key_id, cls)] = ([], [])
                found[0].append(pub)
                found[1].append(value)
        n = len(publications)
        self.width = width = len(columns) + 1
        self.column_of = np.full(len(key_ids) + 1, width - 1, np.int64)
        for key_id, column in columns.items():
            self.column_of[key_id] = column
        if self.inexact_pubs:  # matched by the reference semantics instead: drop them here
            keep = [i for i, item in enumerate(self.items) if item[0] not in self.inexact_pubs]
            self.items = [self.items[i] for i in keep]
            cells = [cells[i] for i in keep]
            classes = [classes[i] for i in keep]
            by_key = {}
            for pub, key_id, cls, value in self.items:
                found = by_key.setdefault((key_id, cls), ([], []))
                found[0].append(pub)
                found[1].append(value)
        pubs = np.fromiter((item[0] for item in self.items), np.int64, len(self.items))
        flat = pubs * width + np.asarray(cells, np.int64)
        class_array = np.asarray(classes, np.int8)
        self.classes = np.full(n * width, -1, np.int8)
        self.classes[flat] = class_array
        self.numbers = np.full(n * width, np.nan)
        self.tokens = np.full(n * width, -1, np.int64)
        numeric = class_array == NUMBER
        values = [item[3] for item in self.items]
        if numeric.any():
            self.numbers[flat[numeric]] = np.array(
                [v for v, m in zip(values, numeric.tolist(), strict=True) if m], np.float64
            )
        if not numeric.all():
            self.tokens[flat[~numeric]] = [
                tokens.get((c, v), -1) for v, c, m in zip(values, classes, numeric.tolist(), strict=True) if not m
            ]
        self._flat = flat
        self._values = values
        self._objects: dict[int, object] | None = None
        self._by_key = by_key
        self._arrays: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.exact_pubs = np.array([p for p in range(n) if p not in self.inexact_pubs], np.int64)

    def value_at(self, cell: int) -> object:
        """The value in a matrix cell, for the predicates checked in Python."""
        if self._objects is None:
            self._objects = dict(zip(self._flat.tolist(), self._values, strict=True))
        return self._objects.get(cell)

    def values_of(self, key_id: int, cls: int) -> tuple[np.ndarray, np.ndarray]:
        """The publications carrying `key_id` with a value of class `cls`, and those values."""
        cached = self._arrays.get((key_id, cls))
        if cached is None:
            found = self._by_key.get((key_id, cls))
            if found is None:
                cached = (np.empty(0, np.int64), np.empty(0))
            else:
                cached = (np.array(found[0], np.int64), np.array(found[1], np.float64 if cls == NUMBER else object))
            self._arrays[(key_id, cls)] = cached
        return cached
