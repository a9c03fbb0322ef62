"""A matcher partition's rounds inside a Python worker, for either trigger: the partition's state
checked out of the worker's cache, the range's entries read from the store, the round core run
(`match.match_round`), the state checked back in.

What the core may not do, this does: read the store. A state that had to be built while the store's
progress is already past the range's start belongs to a round recorded before (a retried task, a
replayed batch): its stateful subscriptions were saved past the range, so the round's stateful part is dropped
and the state rebuilt next time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson

from veil.matching.stored import decode_subscription
from veil.monitoring import trace
from veil.pipeline import worker_state
from veil.pipeline.match import Initial, Retained, match_round
from veil.pipeline.partition import partition_of
from veil.store import (
    KIND_CANCEL,
    KIND_COPY,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    LogEntry,
    PipelineStore,
    Round,
)

REPLAY_PAGE = 1000  # retained publications a replay reads and matches at a time


class Matcher:
    """Picklable: built on the driver, run in executors' Python workers."""

    def __init__(
        self, url: str, partitions: int, by_publication: bool, with_authorization: bool = True,
        entry_timeout: float = 60.0,
    ) -> None:  # fmt: skip
        self.url = url
        self.partitions = partitions
        self.by_publication = by_publication
        self.with_authorization = with_authorization
        self.entry_timeout = entry_timeout  # seconds one log entry may take before it is set aside

    def progress(self, part: int) -> int:
        """The partition whose progress records `part`'s rounds (publication partitioning: one for all)."""
        return 0 if self.by_publication else part

    def state_key(self, part: int) -> worker_state.Key:
        """Where a worker keeps `part`'s state. With publication partitioning one state serves every
        partition: each holds all subscriptions (and ranks none), and a worker's ranges come in log
        order, so the state of the range before is caught up to the next whichever partition's it
        is, and a worker holds one copy of the index instead of one per partition it ever ran."""
        return self.url, self.partitions, 0 if self.by_publication else part

    def round(self, store: PipelineStore, part: int, start: int, end: int) -> Round:
        """Partition `part`'s round of the log range (start, end], to be recorded as the progress of
        `progress(part)` if that is still at `start`."""
        trace.mark("seen", start, end)
        # the pipeline's own output (copies) and withdrawals are not its input
        entries = [e for e in store.log_range(start, end, (KIND_COPY, KIND_CANCEL)) if self._wanted(e, part)]
        trace.mark("read", start, end)
        key = self.state_key(part)
        state, source, failed = worker_state.checkout(
            key, start, store, self._routed_here(part), self.with_authorization, self.entry_timeout,
            ranks=not self.by_publication,
        )  # fmt: skip
        fresh = source != "kept"
        replaying = fresh and store.partition_offset(self.progress(part)) > start
        trace.mark("state", start, end)
        done = match_round(state, entries, end, self._initial(store, entries), self.entry_timeout, failed)
        if replaying:  # what it computed is dropped: rebuild from the store next time
            worker_state.discard(key)
            done = done._replace(stateful=None)
        elif state.suspect:  # a change failed half-way: the next round rebuilds from the store
            worker_state.discard(key)
        else:
            worker_state.checkin(key, state, end)
        if fresh or any(entry.kind != KIND_PUBLICATION and entry.kind != KIND_TICK for entry in entries):
            worker_state.settle()
        trace.mark("matched", start, end)
        return done._replace(part=self.progress(part), start=start, built=source == "built")

    def _initial(self, store: PipelineStore, entries: list[LogEntry]) -> dict[int, Initial]:
        """For each new subscription, the publications still valid when it was logged (by the log's
        clock there) and those retained since its `since`: its initial matches are among them."""
        initial: dict[int, Initial] = {}
        clock = 0
        for entry in entries:
            clock = max(clock, entry.time or 0)
            if entry.kind == KIND_SUBSCRIBE:
                since = _since(entry.body)
                retained = () if since is None else _retained(store, entry.offset, since)
                initial[entry.offset] = Initial(store.valid_at(entry.offset, clock, since), retained)
        return initial

    def _wanted(self, entry: LogEntry, part: int) -> bool:
        """Subscription partitioning: every partition matches every publication against 1/N of the
        subscriptions. Publication partitioning: every partition holds all subscriptions and
        matches the ranges it was given."""
        if entry.kind in (KIND_PUBLICATION, KIND_REGISTRY, KIND_TICK):
            return True
        return self._routed_here(part)(entry.sub_id or "")  # subscription entries name theirs

    def _routed_here(self, part: int) -> Callable[[str], bool]:
        """Whether a subscription id is held by partition `part`."""
        return lambda sub_id: self.by_publication or partition_of(sub_id, self.partitions) == part


def _since(body: bytes | None) -> int | None:
    """The `since` of a subscription's stored body (None for a body it cannot read: the round sets
    that subscription aside)."""
    try:
        return decode_subscription(body or b"").since
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
        return None


def _retained(store: PipelineStore, offset: int, since: int) -> Iterator[Retained]:
    """The retained log a subscription replays, read a page at a time as the round matches it, each
    page with the registry versions it names."""
    after = 0
    while page := store.retained_since(offset, since, after, REPLAY_PAGE):
        versions = {version for _, _, _, version in page}
        yield page, {version: store.registry_at(version) if version else None for version in versions}
        after = page[-1][0]
