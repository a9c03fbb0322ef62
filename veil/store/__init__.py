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
    Webhook,
    WebhookSubscription,
)
from veil.store.credentials import redacted


def _sqlite(url: str, create: bool) -> EventStore:
    from veil.store.sqlite import SqliteStore

    return SqliteStore(url.removeprefix("sqlite://"), create)


def _postgres(url: str, create: bool) -> EventStore:
    from veil.store.postgres import PostgresStore

    return PostgresStore(url, create)


# URL scheme -> how to open it; a path without a scheme is a SQLite file
STORES = {"sqlite": _sqlite, "postgresql": _postgres, "postgres": _postgres}


def open_store(url: str, create: bool = True) -> EventStore:
    """The store a URL names. `create=False` for processes that must find the gateway's store (the
    pipeline, executors): StoreMissing instead of a new, empty one."""
    scheme = url.partition("://")[0] if "://" in url else "sqlite"
    opener = STORES.get(scheme)
    if opener is None:
        shown = redacted(url)
        raise ValueError(f"unsupported store URL {shown!r}: use {' or '.join(f'{s}:///...' for s in STORES)}")
    return opener(url, create)


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
    "Webhook",
    "WebhookSubscription",
    "open_store",
]
