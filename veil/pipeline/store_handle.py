"""One store handle per URL and per Python process, reused across Spark tasks of a worker."""

from __future__ import annotations

from functools import cache

from veil.store import PipelineStore, open_store


@cache
def store_for(url: str) -> PipelineStore:
    """Never creates a store: a pipeline or executor that cannot see the gateway's fails loudly."""
    return open_store(url, create=False)
