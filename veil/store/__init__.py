"""Durable state behind one interface: the event log, subscriptions, delivery queues, cursors."""

from veil.store.base import (
    KIND_CANCEL,
    KIND_COPY,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    EventStore,
    LogEntry,
    NotOwner,
    Publication,
    StatefulBatch,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
    open_store,
)

__all__ = [
    "KIND_CANCEL",
    "KIND_COPY",
    "KIND_PUBLICATION",
    "KIND_REGISTRY",
    "KIND_SUBSCRIBE",
    "KIND_TICK",
    "KIND_UNSUBSCRIBE",
    "EventStore",
    "LogEntry",
    "NotOwner",
    "Publication",
    "StatefulBatch",
    "UnknownAnnouncement",
    "UnknownPublication",
    "UnknownSubscription",
    "open_store",
]
