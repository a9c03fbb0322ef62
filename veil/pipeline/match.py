"""The round core: what one matcher partition decides about a range of the log, as a value.

`match_round(state, entries, end, valid)` takes the partition's state as of the range's start
(`worker_state`) and the partition's log entries of the range, in offset order, and returns the
`Round` the store records: publications are matched and authorized under exactly the subscriptions
and the registry that preceded them in the log, and the state is brought to `end`. It reads no store
and knows no Spark, so both triggers (`rounds`, `micro-batch`) and the tests run the same code.

Stateful subscriptions (SPEC §5, `veil.matching.kinds`) are matched by the same index (their
Boolean filter); the pairs it finds for them, once authorized, go to their states in log order
instead of being delivered, and the log's times are their clock (tick entries move it when nothing
is published). What they select, the states that changed, the oldest publication still held and
the next due moment are the round's `stateful` part, which the store records with the matches,
atomically.

An entry whose processing raises, or runs past `entry_timeout` seconds, is set aside (`guard`): it
goes to the round's quarantine, a publication among them delivers to nobody, and everything else in
the round is processed as usual.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

from veil.matching import Predicate, matches
from veil.matching.kinds import Arrivals, NumericColumns
from veil.matching.stored import decode_subscription
from veil.pipeline.authorize import Authorizer
from veil.pipeline.guard import FAULTS, attempt, isolate, rearm
from veil.pipeline.worker_state import State, Unranked
from veil.protocol import flatten
from veil.store import (
    KIND_PUBLICATION,
    KIND_REDELIVER,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    LogEntry,
    Quarantined,
    Round,
)

RUN_LIMIT = 4096  # publications matched per index call
Valid = list[tuple[int, bytes, str]]  # publications still valid at a subscription: (offset, body, publisher)
# a page of the retained log a subscription replays: (offset, body, publisher, registry version), with
# the registry documents of the versions it names
Retained = tuple[list[tuple[int, bytes, str, int]], Mapping[int, bytes | None]]


class Initial(NamedTuple):
    """What a new subscription receives ahead of its other matches: the publications still valid
    when it was logged (authorized under the registry then in force), and with a `since`, the
    retained ones logged from then on, a page at a time (each authorized under the registry in
    force when it was logged, as it would have been live)."""

    valid: Valid
    retained: Iterable[Retained] = ()


def match_round(
    state: State, entries: Sequence[LogEntry], end: int, initial: Mapping[int, Initial] | None = None,
    entry_timeout: float = 0.0, set_aside: Sequence[Quarantined] = (),
) -> Round:  # fmt: skip
    """The round of `entries` (the partition's entries of the log up to `end`); `initial`: for each
    subscription entry's offset, the publications whose matches it receives first
    (`PipelineStore.valid_at`, `PipelineStore.retained_since`); `set_aside`: what loading the
    state already quarantined."""
    run = _Run()
    out = _Output()
    for aside in set_aside:
        out.quarantine(aside)
    clock = 0
    for entry in entries:
        clock = max(clock, entry.time or 0)
        if entry.kind == KIND_PUBLICATION:
            run.add(entry.offset, entry.body, entry.client or "", clock)  # type: ignore[arg-type]  # a publication has a body
            if len(run) >= RUN_LIMIT:
                run.match(state, out, entry_timeout)
            continue
        # publications before a change are matched and authorized before it applies
        run.match(state, out, entry_timeout)
        if entry.kind == KIND_TICK:
            out.expired(state, clock)
        elif entry.kind == KIND_REDELIVER:  # (one that fails is set aside: it delivers nothing)
            _, error = attempt(entry_timeout, functools.partial(out.redeliver, state, entry))
            if error is not None:
                out.quarantine(Quarantined(entry.offset, entry.kind, entry.sub_id, entry.client, error))
        else:
            _apply(state, out, entry._replace(time=clock), (initial or {}).get(entry.offset, NONE), entry_timeout)
    run.match(state, out, entry_timeout)
    out.expired(state, clock)
    return out.round(state, end)


NONE = Initial([])


def _apply(state: State, out: _Output, entry: LogEntry, initial: Initial, entry_timeout: float) -> None:
    """A subscription or registry change (`entry.time`: the clock of the log at it); one that fails
    (or runs past the bound) is set aside and leaves the subscription out (the registry as it was)."""
    kind, sub_id, body = entry.kind, entry.sub_id or "", entry.body
    unranked = False

    def change() -> None:
        nonlocal unranked
        if kind == KIND_REGISTRY:
            state.set_registry(body)
        elif kind == KIND_SUBSCRIBE:
            number, owner = entry.number, entry.client
            if body is None or number is None or owner is None:
                raise ValueError("a subscription entry without its body, number or owner")
            FAULTS.check(body)
            try:
                state.add(sub_id, number, owner, body)
            except Unranked:
                unranked = True  # refused whole: nothing to rebuild the state for
                raise
            if not state.is_stateful[number]:
                out.initial(state, number, body, initial)
        else:
            state.remove(sub_id)

    _, error = attempt(entry_timeout, change)
    if error is not None:
        state.suspect = state.suspect or not unranked
        if kind == KIND_SUBSCRIBE:
            state.remove(sub_id)
        out.quarantine(Quarantined(entry.offset, kind, entry.sub_id, entry.client, error))


class _Run:
    """Consecutive publications with no subscription or registry change between them: matched and
    authorized as one batch."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.documents: list[dict | None] = []  # parsed on first use, inside the guard
        self.bodies: list[bytes] = []
        self.publishers: list[str] = []
        self.times: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, body: bytes, publisher: str, time: int) -> None:
        self.offsets.append(offset)
        self.documents.append(None)
        self.bodies.append(body)
        self.publishers.append(publisher)
        self.times.append(time)

    def _matched(self, state: State, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        """Match and authorize publications [lo, hi): (publication positions, subscription numbers, which
        pairs are kept, cropped copies by pair position). Nothing outside the return value changes
        but the parsed documents, so a failed attempt can be retried on a part of the range."""
        documents = self.documents
        for i in range(lo, hi):
            if documents[i] is None:
                FAULTS.check(self.bodies[i])
                documents[i] = flatten(orjson.loads(self.bodies[i]))
        part: list[dict[str, Any]] = documents[lo:hi]  # type: ignore[assignment]  # all parsed just above
        pubs, slots = state.index.match_pairs(part)
        sub_nos = state.index.numbers(slots)
        keep, copies = state.authorizer.filter(
            part, self.bodies[lo:hi], self.publishers[lo:hi], pubs, state.owners[sub_nos], state.scopes[sub_nos],
            state.admitted[sub_nos],
        )  # fmt: skip
        return pubs + lo, sub_nos, keep, copies

    def match(self, state: State, out: _Output, seconds: float = 0) -> None:
        if not self.offsets:
            return
        pieces, failed = isolate(0, len(self.offsets), seconds, lambda lo, hi: self._matched(state, lo, hi))
        for position, error in failed:
            offset, publisher = self.offsets[position], self.publishers[position]
            out.quarantine(Quarantined(offset, KIND_PUBLICATION, None, publisher, error))
        if pieces:
            pubs = np.concatenate([piece[0] for _, _, piece in pieces])
            sub_nos = np.concatenate([piece[1] for _, _, piece in pieces])
            keep = np.concatenate([piece[2] for _, _, piece in pieces])
            crops: dict[int, bytes] = {}
            shift = 0
            for _, _, piece in pieces:
                crops.update((pair + shift, copy) for pair, copy in piece[3])
                shift += len(piece[0])
            offsets = np.asarray(self.offsets, np.int64)
            if state.stateful:
                ranked = state.is_stateful[sub_nos]
                self._rank(state, out, pubs, sub_nos, np.flatnonzero(ranked & keep), crops, seconds)
                keep &= ~ranked
                crops = {pair: copy for pair, copy in crops.items() if not ranked[pair]}
            if crops:
                cropped = np.fromiter(crops, np.int64, len(crops))
                out.copies(offsets[pubs[cropped]], sub_nos[cropped], list(crops.values()))
                keep[cropped] = False
            out.offsets.append(offsets[pubs[keep]])
            out.sub_nos.append(sub_nos[keep])
        self.offsets, self.documents, self.bodies, self.publishers, self.times = [], [], [], [], []

    def _rank(
        self, state: State, out: _Output, pubs: np.ndarray, sub_nos: np.ndarray, pairs: np.ndarray,
        crops: dict[int, bytes], seconds: float,
    ) -> None:  # fmt: skip
        """Authorized matches of stateful subscriptions to their states, each subscription's in log
        order; a cropped copy is judged on what its subscriber would see, and kept while the state
        holds it. A subscription whose state fails (or runs past the bound) is set aside."""
        pairs = pairs[np.argsort(sub_nos[pairs] * len(self.offsets) + pubs[pairs])]  # each pair once
        numbers = sub_nos[pairs]
        columns = NumericColumns([document or {} for document in self.documents])
        bounds = np.flatnonzero(np.diff(numbers)) + 1
        all_offsets, all_times = np.asarray(self.offsets, np.int64), np.asarray(self.times, np.int64)

        def arrive(mine: np.ndarray) -> list[tuple[int, int, bytes | None]]:
            number = int(sub_nos[mine[0]])
            positions = pubs[mine]
            offsets = all_offsets[positions].tolist()
            replaced = {}
            for i, pair in enumerate(mine.tolist() if crops else ()):
                copy = crops.get(pair)
                if copy is not None:
                    replaced[i] = flatten(orjson.loads(copy))
                    state.crops.setdefault(number, {})[offsets[i]] = copy
            arrivals = Arrivals(offsets, all_times[positions].tolist(), columns, positions, replaced)
            kept = state.crops.get(number, {})
            return [(number, selected.seq, kept.get(selected.seq)) for selected in state.kinds.arrive(number, arrivals)]

        groups = np.split(pairs, bounds) if len(pairs) else []
        done = 0

        def rest() -> None:
            nonlocal done
            for mine in groups[done:]:
                rearm()  # each subscription has the bound to itself
                out.logged.extend(arrive(mine))
                done += 1

        while done < len(groups):
            _, error = attempt(seconds, rest)
            if error is None or done >= len(groups):
                break
            number = int(sub_nos[groups[done][0]])  # the subscription that failed: set aside, the rest go on
            sub_id = next(sub_id for sub_id, n in state.stateful.items() if n == number)
            state.remove(sub_id)
            out.quarantine(Quarantined(0, KIND_SUBSCRIBE, sub_id, None, error))
            done += 1


class _Output:
    """A round's output as it grows: plain matches as columns, cropped copies beside them, what
    stateful subscriptions selected (`logged`), initial matches and what was set aside."""

    def __init__(self) -> None:
        self.offsets: list[np.ndarray] = []
        self.sub_nos: list[np.ndarray] = []
        self.cropped: list[tuple[int, int, bytes]] = []  # (subscription number, publication, copy)
        self.logged: list[tuple[int, int, bytes | None]] = []  # (number, publication, cropped copy)
        self.initials: list[tuple[int, int, bytes | None]] = []  # (number, publication, cropped copy)
        self.quarantined: dict[tuple[int, str | None], Quarantined] = {}

    def initial(self, state: State, number: int, body: bytes, initial: Initial) -> None:
        """A new subscription's initial matches: the still-valid publications, then the retained
        ones it asked for, that it matches and may see. They are older than the subscription and
        than all its other matches, so they queue as plain matches ahead of those. A replayed one
        is one its subscriber may receive now and could have received live when it was logged
        (under the registry then in force): a right given since does not reach back, one taken
        away since holds, and the copy is cropped as the registry in force crops it, then as the
        earlier one did."""
        if not initial.valid and not initial.retained:
            return
        predicates = decode_subscription(body).predicates
        poisoned = {q.offset for q in self.quarantined.values() if q.kind == KIND_PUBLICATION}
        self._initial(state, number, predicates, initial.valid, [state.authorizer], poisoned)
        for page, registries in initial.retained:
            for version in dict.fromkeys(version for _, _, _, version in page):
                mine = [(offset, published, publisher) for offset, published, publisher, at in page if at == version]
                then = state.authorizer_at(version, registries[version])
                self._initial(state, number, predicates, mine, [state.authorizer, then], poisoned)

    def _initial(
        self, state: State, number: int, predicates: list[Predicate], publications: Valid,
        authorizers: list[Authorizer], poisoned: set[int],
    ) -> None:  # fmt: skip
        """The publications a new subscription matches and every one of `authorizers` lets it see
        (each cropping what the one before left), to its initials; those this round set aside
        (`poisoned`) deliver to nobody."""
        offsets: list[int] = []
        documents: list[dict[str, Any]] = []
        bodies: list[bytes] = []
        publishers: list[str] = []
        for offset, published, publisher in publications:
            if offset in poisoned:
                continue
            try:
                document = flatten(orjson.loads(published))
            except (orjson.JSONDecodeError, TypeError, ValueError):  # (the pipeline quarantined it when logged)
                continue
            if matches(predicates, document):
                offsets.append(offset)
                documents.append(document)
                bodies.append(published)
                publishers.append(publisher)
        cropped = [False] * len(offsets)
        for authorizer in dict.fromkeys(authorizers):  # (the same one once)
            if not offsets:
                return
            owners, scopes, admitted = (
                np.full(len(offsets), column[number], column.dtype)
                for column in (state.owners, state.scopes, state.admitted)
            )
            keep, copies = authorizer.filter(
                documents, bodies, publishers, np.arange(len(offsets), dtype=np.int64), owners, scopes, admitted
            )
            for pair, copy in copies:
                bodies[pair], documents[pair], cropped[pair] = copy, flatten(orjson.loads(copy)), True
            kept = np.flatnonzero(keep).tolist()
            offsets = [offsets[i] for i in kept]
            documents = [documents[i] for i in kept]
            bodies = [bodies[i] for i in kept]
            publishers = [publishers[i] for i in kept]
            cropped = [cropped[i] for i in kept]
        for offset, copy, was_cropped in zip(offsets, bodies, cropped, strict=True):
            self.initials.append((number, offset, copy if was_cropped else None))

    def redeliver(self, state: State, entry: LogEntry) -> None:
        """A dead letter its subscription's owner replays: queued again for the subscription of that
        number if it is still live and may still receive it (the registry in force may crop it
        further). It queues in log order, after whatever was queued for it before; a stateful
        subscription's goes as what it selected (its queue holds copies logged in that order)."""
        number = entry.number
        if number is None or state.index.number_of(entry.sub_id or "") != number or entry.body is None:
            return
        try:
            document = flatten(orjson.loads(entry.body))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return
        keep, copies = state.authorizer.filter(
            [document], [entry.body], [entry.client or ""], np.zeros(1, np.int64), state.owners[[number]],
            state.scopes[[number]], state.admitted[[number]],
        )  # fmt: skip
        if not keep[0]:
            return
        copy = dict(copies).get(0)
        if state.is_stateful[number]:
            self.logged.append((number, entry.offset, copy))
        elif copy is not None:
            self.copies(np.array([entry.offset]), np.array([number]), [copy])
        else:
            self.offsets.append(np.array([entry.offset], np.int64))
            self.sub_nos.append(np.array([number], np.int64))

    def expired(self, state: State, now: int) -> None:
        """What the clock's move to `now` selects."""
        for number, selected in state.kinds.advance(now):
            self.logged.append((number, selected.seq, state.crops.get(number, {}).get(selected.seq)))

    def quarantine(self, entry: Quarantined) -> None:
        self.quarantined[entry.offset, entry.sub_id] = entry

    def copies(self, offsets: np.ndarray, sub_nos: np.ndarray, bodies: list[bytes]) -> None:
        """Matches that deliver a cropped copy: they travel with it."""
        self.cropped.extend(zip(sub_nos.tolist(), offsets.tolist(), bodies, strict=True))

    def round(self, state: State, end: int) -> Round:
        """The round; a publication the round could not process is delivered by none of its
        subscriptions."""

        def joined(chunks: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(chunks) if chunks else np.empty(0, np.int64)

        offsets, sub_nos, cropped = joined(self.offsets), joined(self.sub_nos), self.cropped
        quarantined = list(self.quarantined.values())
        poisoned = {q.offset for q in quarantined if q.kind == KIND_PUBLICATION}
        if poisoned:
            kept = ~np.isin(offsets, list(poisoned))
            offsets, sub_nos = offsets[kept], sub_nos[kept]
            cropped = [copy for copy in cropped if copy[1] not in poisoned]
        if cropped:
            offsets = np.concatenate([offsets, np.array([pub for _, pub, _ in cropped], np.int64)])
            sub_nos = np.concatenate([sub_nos, np.array([number for number, _, _ in cropped], np.int64)])
        stateful = state.stateful_output(self.logged, self.initials)
        return Round(sub_nos, offsets, end, cropped, stateful, quarantined)
