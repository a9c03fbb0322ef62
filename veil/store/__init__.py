"""Durable state behind one interface: the event log, subscriptions, delivery queues, cursors."""

from veil.store.base import (
    BATCH_BOUNDS_MS,
    DEAD_LETTER_REASONS,
    KEYS_KEPT,
    KIND_CANCEL,
    KIND_COPY,
    KIND_PUBLICATION,
    KIND_REDELIVER,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    REPLAY_MOST,
    BatchDurations,
    DeadLetter,
    EventStore,
    GatewayStore,
    LogEntry,
    NotOwner,
    Ownership,
    PipelineStatus,
    PipelineStore,
    Publication,
    Quarantined,
    QuarantineRecord,
    QueueBounds,
    Round,
    StaleRegistry,
    StatefulBatch,
    StoreMissing,
    StoreUnavailable,
    TooMany,
    Totals,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)
from veil.store.credentials import redacted


def _sqlite(url: str, create: bool, synced: bool) -> EventStore:
    from veil.store.sqlite import SqliteStore

    return SqliteStore(url.removeprefix("sqlite://"), create, synced)


def _postgres(url: str, create: bool, synced: bool) -> EventStore:
    from veil.store.postgres import PostgresStore

    return PostgresStore(url, create, synced)


# URL scheme -> how to open it; a path without a scheme is a SQLite file
STORES = {"sqlite": _sqlite, "postgresql": _postgres, "postgres": _postgres}


def open_store(url: str, create: bool = True, synced: bool = True) -> EventStore:
    """The store a URL names. `create=False` for processes that must find the gateway's store (the
    pipeline, executors): StoreMissing instead of a new, empty one.

    `synced=False` for the matcher rounds' writes, which are all derived from the log: a commit returns
    before it is on disk (SQLite's synchronous=NORMAL, PostgreSQL's synchronous_commit=off). Both
    stores write ahead to one log, flushed in order, so the next synced commit of any process (a group
    commit of publications, a cursor save) makes every commit before it durable as well; power lost
    before that loses only the last rounds, matched again on restart as if the pipeline had been
    slower, and their deliveries are sent again as after any crash before a cursor save. On two cores
    at 3,000 publications/s, a flush per round cost a quarter of the publications the gateway's
    acknowledgements could carry."""
    scheme = url.partition("://")[0] if "://" in url else "sqlite"
    opener = STORES.get(scheme)
    if opener is None:
        shown = redacted(url)
        raise ValueError(f"unsupported store URL {shown!r}: use {' or '.join(f'{s}:///...' for s in STORES)}")
    return opener(url, create, synced)


__all__ = [
    "BATCH_BOUNDS_MS",
    "DEAD_LETTER_REASONS",
    "KEYS_KEPT",
    "KIND_CANCEL",
    "KIND_COPY",
    "KIND_PUBLICATION",
    "KIND_REDELIVER",
    "KIND_REGISTRY",
    "KIND_SUBSCRIBE",
    "KIND_TICK",
    "KIND_UNSUBSCRIBE",
    "REPLAY_MOST",
    "BatchDurations",
    "DeadLetter",
    "EventStore",
    "GatewayStore",
    "LogEntry",
    "NotOwner",
    "Ownership",
    "PipelineStatus",
    "PipelineStore",
    "Publication",
    "QuarantineRecord",
    "Quarantined",
    "QueueBounds",
    "Round",
    "StaleRegistry",
    "StatefulBatch",
    "StoreMissing",
    "StoreUnavailable",
    "TooMany",
    "Totals",
    "UnknownAnnouncement",
    "UnknownPublication",
    "UnknownSubscription",
    "open_store",
]
