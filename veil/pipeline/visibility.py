"""The scope part of the authorize stage (SPEC §7, seed 003): which matched pairs are visible, as
`security.scopes` defines it, for a batch at a time.

A pair (publication, subscription) is visible when the subscription's scope is among those the
publication reaches from the scope it was published into, and the subscription's owner is in that
scope: the world holds everyone, a registry member is looked up as a (user, scope) key, and a
subscription admitted by its owner's attributes holds while its scope exists. Reach is computed
once per publication (a walk over the few scopes its interfaces let it into); the pairs are then
numpy set membership on (publication, scope) and (user, scope) keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.pipeline.numbering import SCOPE_WIDTH, scope_number, user_number
from veil.protocol.reserved import scope_of
from veil.security.registry import Registry
from veil.security.scopes import WORLD


class Visibility:
    """One registry version's scopes, compiled for batches."""

    def __init__(self, registry: Registry) -> None:
        self.scopes = registry.scopes
        self.known = np.array(sorted(scope_number(name) for name in self.scopes.by_name), np.int64)
        members = [
            user_number(user) * SCOPE_WIDTH + scope_number(name)
            for name in self.scopes.by_name
            for user in self.scopes.members(name, registry.members)
        ]
        self.members = np.array(sorted(members), np.int64)

    def visible(
        self, documents: Sequence[dict], pubs: np.ndarray, owners: np.ndarray, scopes: np.ndarray, admitted: np.ndarray
    ) -> np.ndarray | None:
        """Which pairs are visible; None when the batch has nothing to do with scopes (all of it in the
        world, and no scope to import it)."""
        origins = [scope_of(document) for document in documents]
        if not self.scopes and not scopes.any() and not any(o is not None for o in origins):
            return None
        reach: list[int] = []
        for position, (origin, document) in enumerate(zip(origins, documents, strict=True)):
            if origin is None:
                origin = WORLD
            elif not isinstance(origin, str):
                continue
            base = position * SCOPE_WIDTH
            reach.extend(base + scope_number(name) for name in self.scopes.reach(origin, document))
        visible = np.isin(pubs * SCOPE_WIDTH + scopes, np.array(reach, np.int64))
        inside = (scopes == 0) | (admitted & np.isin(scopes, self.known))
        inside |= np.isin(owners * SCOPE_WIDTH + scopes, self.members)
        return visible & inside
