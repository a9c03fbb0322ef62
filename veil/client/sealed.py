"""Sealed payloads on the client's side (SPEC §7): a publication's payload sealed for a scope's
members on publish and opened on delivery, so that the brokers carry only ciphertext.

The sealed payload rides in the publication as `veil:sealed` beside the routing attributes, which
stay in clear for matching; the attributes (with `veil:scope`) are the associated data, in a
canonical form (keys sorted), so a broker cannot graft a payload onto other attributes. A member
holds a scope key version once it has fetched its envelope from the broker and unwrapped it with
its recipient key (X25519); `ScopeKeyring` keeps the versions it has opened.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import orjson
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from veil.protocol.reserved import SCOPE, SEALED
from veil.security.sealing import ScopeKey, SealError, open_sealed, seal, sealed_version, unwrap

Fetch = Callable[[str, int | None], Awaitable[tuple[int, bytes] | None]]  # (scope, version) -> (version, envelope)


def associated_data(publication: dict) -> bytes:
    """What a sealed payload is bound to: the publication without it, keys sorted."""
    return orjson.dumps({k: v for k, v in publication.items() if k != SEALED}, option=orjson.OPT_SORT_KEYS)


def seal_publication(attributes: dict, payload: bytes, key: ScopeKey) -> dict:
    if SEALED in attributes:
        raise ValueError(f"{SEALED} is where the sealed payload goes; the attributes cannot have it")
    routed = {**attributes, SCOPE: key.scope}
    sealed = seal(payload, key, associated_data(routed))
    return {**routed, SEALED: base64.b64encode(sealed).decode()}


class ScopeKeyring:
    """The scope key versions a member has opened, fetched when first needed."""

    def __init__(self, recipient_key: X25519PrivateKey, fetch: Fetch) -> None:
        self.recipient_key = recipient_key
        self._fetch = fetch
        self._keys: dict[tuple[str, int], ScopeKey] = {}
        self._newest: dict[str, int] = {}

    async def key(self, scope: str, version: int | None = None) -> ScopeKey | None:
        """A version (the newest by default); None when the broker has no envelope of it for us."""
        if version is None:
            version = self._newest.get(scope)
        if version is not None and (scope, version) in self._keys:
            return self._keys[(scope, version)]
        fetched = await self._fetch(scope, version)
        if fetched is None:
            return None
        version, envelope = fetched
        key = unwrap(envelope, scope, version, self.recipient_key)
        self._keys[(scope, version)] = key
        self._newest[scope] = max(version, self._newest.get(scope, 0))
        return key

    def forget_newest(self, scope: str) -> None:
        """After the broker refused the newest known version: a rotation happened since."""
        self._newest.pop(scope, None)

    async def open(self, publication: dict) -> bytes | None:
        """The publication's payload; None when it has none or we hold no key of its version (we are
        not a member of its scope, or were not when it was sealed); SealError when it was tampered
        with."""
        sealed, scope = publication.get(SEALED), publication.get(SCOPE)
        if not isinstance(sealed, str) or not isinstance(scope, str):
            return None
        try:
            raw = base64.b64decode(sealed, validate=True)
        except ValueError:
            raise SealError("the sealed payload is not base64") from None
        key = await self.key(scope, sealed_version(raw))
        if key is None:
            return None
        return open_sealed(raw, key, associated_data(publication))
