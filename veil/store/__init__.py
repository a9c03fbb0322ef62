"""Durable state behind one interface: the event log, subscriptions, delivery queues, cursors."""

from veil.store.base import (
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_UNSUBSCRIBE,
    EventStore,
    LogEntry,
    NotOwner,
    Publication,
    UnknownSubscription,
    open_store,
)

__all__ = [
    "KIND_PUBLICATION",
    "KIND_REGISTRY",
    "KIND_SUBSCRIBE",
    "KIND_UNSUBSCRIBE",
    "EventStore",
    "LogEntry",
    "NotOwner",
    "Publication",
    "UnknownSubscription",
    "open_store",
]
