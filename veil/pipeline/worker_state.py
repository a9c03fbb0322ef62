"""The state a Python worker keeps for each matcher partition between rounds, and its
catch-up contract.

A partition's state (`State`) is what its matcher holds at one log offset: the subscription index,
who owns each subscription, the registry version compiled for authorization, and the states of its
stateful subscriptions (`veil.matching.kinds`). The cache keeps it per (store URL, partitions,
partition) in the worker process, tagged with the offset it reflects (with publication partitioning
one state serves every partition: `Matcher.state_key`).

Contract
--------
checkout(key, start, ...)
    Takes the partition's state out of the cache as of offset `start`. The state is out of the
    cache while a task uses it, so two tasks never share one. If the cache holds it at `start`, it
    is returned as it was. If it holds it at an earlier offset, the subscription changes and the
    registry version between the two are applied from the store; if it holds nothing (another worker
    had the partition, the worker is new) or holds it past `start` (a retried or replayed round), the
    state is built from the store's subscriptions and registry in force at `start`. Either way the
    stateful subscriptions' states are read back as of the processed offset. A subscription that
    fails to load (or a stateful one, where the partition does not rank them) is left out and
    returned for the quarantine.
held(url, partitions)
    The partitions whose state the cache holds: a task claims these first, so that an epoch's tasks
    find the states their workers already hold instead of building each other's.
checkin(key, state, end)
    Puts the state back, at the offset `end` that the round brought it to.
discard(key)
    Forgets the state: the next task builds it from the store (a replayed round, whose effects on
    the stateful subscriptions were already recorded, a round the store did not take, or a change that failed
    half-way).
keep(keys)
    Forgets the states of all other partitions (a task keeps only what it runs).

Publications are therefore matched and authorized under exactly the subscriptions and the registry
that preceded them in the log, whichever worker runs the task.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable
from typing import Literal

import msgspec
import numpy as np

from veil.matching import SubscriptionIndex
from veil.matching.kinds import KindStates
from veil.matching.stored import decode_subscription
from veil.pipeline.authorize import Authorizer
from veil.pipeline.guard import attempt
from veil.pipeline.numbering import scope_number, user_number
from veil.security.registry import registry_from_json
from veil.store import KIND_SUBSCRIBE, PipelineStore, Quarantined, StatefulBatch

EARLIER_REGISTRIES = 4  # authorizers of earlier registry versions kept for replays
LATEST_DUE = 2**62  # ms: later expiries are reported as this one (msgpack and SQLite hold int64)
Key = tuple[str, int, int]  # (store URL, partitions, partition or 0 for all: `Matcher.state_key`)
Source = Literal["kept", "caught up", "built"]  # where a checked-out state came from

_cache: dict[Key, tuple[State, int]] = {}
log = logging.getLogger("veil.pipeline")


class Unranked(ValueError):
    """A stateful subscription where the partition ranks none: refused before the state changes."""


class State:
    """What a matcher partition holds: its subscriptions, their owners and scopes, the registry in force."""

    def __init__(self, registry_body: bytes | None, with_authorization: bool, ranks: bool = True) -> None:
        self.index = SubscriptionIndex()
        self.owners = np.full(1024, -1, np.int64)  # subscription number -> owner's user number
        self.scopes = np.zeros(1024, np.int64)  # subscription number -> its scope's number (0: the world)
        self.admitted = np.zeros(1024, bool)  # subscription number -> admitted to its scope by attributes
        self.with_authorization = with_authorization
        self.registry_body = registry_body
        self.authorizer = Authorizer(registry_from_json(registry_body), with_authorization)
        self._earlier: dict[int, Authorizer] = {}  # registry version -> its authorizer, least recent first
        # stateful subscriptions are ranked by the one partition holding each, in log order: with
        # publication partitioning every partition holds them and ranks a slice of the log
        self.ranks = ranks
        self.kinds = KindStates()
        self.stateful: dict[str, int] = {}  # id -> number of the stateful subscriptions
        self.is_stateful = np.zeros(1024, bool)  # by subscription number
        self.crops: dict[int, dict[int, bytes]] = {}  # number -> publication -> cropped copy its state holds
        # set when applying a change failed half-way: the next round rebuilds from the store instead
        self.suspect = False

    def add(self, sub_id: str, number: int, owner: str, body: bytes) -> None:
        predicates, topk, scope, admitted, _ = decode_subscription(body)  # a bad body changes nothing
        kind = None if topk is None else self.kinds.spec(topk)
        if kind is not None and not self.ranks:
            raise Unranked(f"{kind[0].name} subscriptions need the pipeline's --partition-mode subscriptions")
        if number >= len(self.owners):
            grow = max(number + 1, 2 * len(self.owners)) - len(self.owners)
            self.owners = np.concatenate([self.owners, np.full(grow, -1, np.int64)])
            self.scopes = np.concatenate([self.scopes, np.zeros(grow, np.int64)])
            self.admitted = np.concatenate([self.admitted, np.zeros(grow, bool)])
            self.is_stateful = np.concatenate([self.is_stateful, np.zeros(grow, bool)])
        self.owners[number] = user_number(owner)
        self.scopes[number] = scope_number(scope)
        self.admitted[number] = admitted
        self.remove(sub_id)
        self.index.add(sub_id, predicates, number)
        if kind is not None:
            self.kinds.add(number, *kind)
            self.stateful[sub_id] = number
            self.is_stateful[number] = True

    def remove(self, sub_id: str) -> None:
        self.index.remove(sub_id)
        number = self.stateful.pop(sub_id, None)
        if number is not None:
            self.kinds.remove(number)
            self.is_stateful[number] = False
            self.crops.pop(number, None)

    def load_states(self, store: PipelineStore) -> None:
        """Put back the stateful subscriptions' states saved with the last recorded round. A state
        built at an offset before that round (a task retried after its round was recorded) may hold
        a subscription replaced since by one of another kind under the same number: its saved state
        does not fit, and the fresh one stays (that round's stateful part is not recorded again)."""
        for number, blob in store.subscription_states(list(self.stateful.values())).items():
            snapshot, crops = msgspec.msgpack.decode(blob)
            try:
                self.kinds.restore(number, snapshot)
            except (ValueError, TypeError, KeyError, IndexError):
                log.warning("the saved state of subscription number %d is of another kind: it starts afresh", number)
                continue
            if crops:
                self.crops[number] = {int(pub): copy for pub, copy in crops.items()}
        self.kinds.touched.clear()

    def stateful_output(
        self, deliveries: list[tuple[int, int, bytes | None]], initials: list[tuple[int, int, bytes | None]]
    ) -> StatefulBatch | None:
        """The round's stateful output; the touched states are saved with the cropped copies they hold."""
        if not deliveries and not initials and not self.stateful and not self.kinds.touched:
            return None
        states: list[tuple[int, bytes | None]] = []
        for number in sorted(self.kinds.touched):
            state = self.kinds.states.get(number)
            if state is None:
                states.append((number, None))
                continue
            crops = self.crops.get(number, {})
            held = {pub: crops[pub] for pub in state.held() if pub in crops} if crops else {}
            if len(held) < len(crops):
                self.crops[number] = held
            states.append((number, msgspec.msgpack.encode([state.snapshot(), held])))
        self.kinds.touched.clear()
        due = self.kinds.next_due()
        due = None if due is None else min(math.ceil(due), LATEST_DUE)
        return StatefulBatch(deliveries, initials, states, self.kinds.oldest_held(), due)

    def set_registry(self, body: bytes | None) -> None:
        if body != self.registry_body:  # compiling a large registry costs: only when it changed
            self.authorizer = Authorizer(registry_from_json(body), self.with_authorization)
            self.registry_body = body

    def authorizer_at(self, version: int, body: bytes | None) -> Authorizer:
        """The authorizer of an earlier registry version (its document `body`), for a replay of the
        publications logged under it: the last few are kept, as consecutive replays name the same ones."""
        if body == self.registry_body:
            return self.authorizer
        authorizer = self._earlier.pop(version, None) or Authorizer(registry_from_json(body), self.with_authorization)
        self._earlier[version] = authorizer
        while len(self._earlier) > EARLIER_REGISTRIES:
            del self._earlier[next(iter(self._earlier))]
        return authorizer


def checkout(
    key: Key, start: int, store: PipelineStore, mine: Callable[[str], bool], with_authorization: bool,
    entry_timeout: float, ranks: bool = True,
) -> tuple[State, Source, list[Quarantined]]:  # fmt: skip
    """The partition's state as of `start`; where it came from; the subscriptions set aside while
    loading it (`mine`: whether a subscription id is this partition's; `ranks`: whether it keeps
    stateful subscriptions or sets them aside)."""
    cached = _cache.pop(key, None)
    if cached is not None and cached[1] == start:
        return cached[0], "kept", []
    source: Source = "caught up" if cached is not None and cached[1] < start else "built"
    if cached is not None and source == "caught up":
        state = cached[0]
        dropped, added = store.subscription_changes(cached[1], start)
        for sub_id in dropped:
            state.remove(sub_id)
        state.set_registry(store.registry_at(start))
    else:
        state = State(store.registry_at(start), with_authorization, ranks)
        added = store.subscriptions_at(start)
    failed = []
    for sub_id, number, owner, body in added:
        if mine(sub_id):
            _, error = attempt(entry_timeout, lambda: state.add(sub_id, number, owner, body))  # noqa: B023
            if error is not None:
                state.remove(sub_id)
                failed.append(Quarantined(0, KIND_SUBSCRIBE, sub_id, owner, error))
    state.load_states(store)
    return state, source, failed


def held(url: str, partitions: int) -> set[int]:
    return {part for key_url, count, part in _cache if (key_url, count) == (url, partitions)}


def checkin(key: Key, state: State, end: int) -> None:
    _cache[key] = (state, end)


def discard(key: Key) -> None:
    if _cache.pop(key, None) is not None:
        gc.unfreeze()  # the next `settle` collects what the state held


def keep(keys: set[Key]) -> None:
    """Forget the states of every partition but these: a worker that ran another partition's task
    once would otherwise hold that state too, and in time every partition's."""
    for key in [key for key in _cache if key not in keys]:
        discard(key)


def settle() -> None:
    """PySpark's worker daemon runs a full `gc.collect()` after every task, and over an index of many
    thousands of Python objects that collection was most of a worker's CPU. Collect once when the
    index changed and move what survives (the index) out of the collector's sight."""
    gc.collect()
    gc.freeze()
