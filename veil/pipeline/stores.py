"""One store handle per URL and per Python process, reused across Spark tasks of a worker."""

from __future__ import annotations

from functools import cache

from veil.store import EventStore, open_store


@cache
def store_for(url: str) -> EventStore:
    return open_store(url)
