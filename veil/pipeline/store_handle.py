"""One store handle per URL and per Python process, reused across Spark tasks of a worker."""

from __future__ import annotations

from functools import cache

from veil.store import PipelineStore, open_store


@cache
def store_for(url: str) -> PipelineStore:
    """Never creates a store: a pipeline or executor that cannot see the gateway's fails loudly. Its
    commits are not each flushed to disk (`open_store`'s `synced`): what it writes derives from the log."""
    return open_store(url, create=False, synced=False)
