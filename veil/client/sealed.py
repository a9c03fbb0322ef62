"""Sealed payloads on the client's side (SPEC §7): a publication's payload sealed for a scope's
members on publish and opened on delivery, so that the brokers carry only ciphertext.

The sealed payload rides in the publication as `veil:sealed` beside the routing attributes, which
stay in clear for matching; the attributes (with `veil:scope` and `veil:origin`: the publisher's
name as its scope's roster gives it, a random id and the time) are the associated data, in their
RFC 8785 canonical form, so a broker cannot graft a payload onto other attributes or pass an old
one off as new, and a client in any language reproduces what was bound. (Any member holds the scope
key, so only the gateway's check that a publisher names itself, or a publisher's signature, keeps
one member from sealing in another's name.) A member holds a scope key version once it has fetched
its envelope from the broker, verified the roster that comes with it against the scope's manager
keys it pins, and unwrapped it with its recipient key; `ScopeKeyring` keeps the versions it has
opened and the newest version it has seen of each scope, below which it believes no roster.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple

from veil.protocol.canonical import canonical
from veil.protocol.reserved import MAX_ORIGIN_ID, ORIGIN, SCOPE, SEALED
from veil.security.rosters import believed
from veil.security.sealing import RecipientKey, ScopeKey, SealError, open_sealed, recipient_public, seal, sealed_version
from veil.security.sealing import unwrap as unwrap_envelope

Fetch = Callable[[str, int | None], Awaitable[dict | None]]  # (scope, version) -> the broker's answer
Managers = Mapping[str, Mapping[str, bytes]]  # scope -> key id -> raw Ed25519 public key of a manager
REMEMBERED = 100_000  # origins a stream remembers to tell replays by: about 10 MB
MISS_SECONDS = 60.0  # a version the broker has no key of for us is not asked for again this long
NEW_MISS_SECONDS = 5.0  # nor one newer than any this client saw
MAX_MISSES = 10_000


class Origin(NamedTuple):
    publisher: str
    id: str
    time: int  # milliseconds since the epoch, by the publisher's clock


def origin_of(publication: dict) -> Origin | None:
    found = publication.get(ORIGIN)
    if not isinstance(found, dict):
        return None
    publisher, origin_id, at = found.get("publisher"), found.get("id"), found.get("time")
    if not isinstance(publisher, str) or not isinstance(origin_id, str) or len(origin_id) > MAX_ORIGIN_ID:
        return None
    if not isinstance(at, int) or isinstance(at, bool):
        return None
    return Origin(publisher, origin_id, at)


class ReplayWindow:
    """The origins a stream's subscriptions got in their last REMEMBERED sealed deliveries: a broker
    that delivers one of them again to the same subscription, under a new sequence number, is
    delivering a replay. (A publication matching two subscriptions of one stream comes once to each.)"""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._seen: set[tuple[str, str, str]] = set()
        self._order: deque[tuple[str, str, str]] = deque()
        self._size = size

    def replayed(self, origin: Origin, subscriptions: tuple[str, ...]) -> bool:
        """Whether one of these subscriptions got this origin; it is remembered for them from now on."""
        keys = [(origin.publisher, origin.id, sub) for sub in subscriptions]
        if any(key in self._seen for key in keys):
            return True
        for key in keys:
            self._seen.add(key)
            self._order.append(key)
        while len(self._order) > self._size:
            self._seen.discard(self._order.popleft())
        return False


def associated_data(publication: dict) -> bytes:
    """What a sealed payload is bound to: the publication without it, in canonical JSON."""
    return canonical({k: v for k, v in publication.items() if k != SEALED})


def seal_publication(attributes: dict, payload: bytes, key: ScopeKey, publisher: str) -> dict:
    if SEALED in attributes or ORIGIN in attributes:
        raise ValueError(f"{SEALED} and {ORIGIN} are where the seal goes; the attributes cannot have them")
    origin_id = base64.b64encode(os.urandom(16)).decode()
    origin = {"publisher": publisher, "id": origin_id, "time": time.time_ns() // 1_000_000}
    routed = {**attributes, SCOPE: key.scope, ORIGIN: origin}
    sealed = seal(payload, key, associated_data(routed))
    return {**routed, SEALED: base64.b64encode(sealed).decode()}


class ScopeKeyring:
    """The scope key versions a member has opened, fetched when first needed and believed only as a
    manager it pins signed them."""

    def __init__(
        self, recipient_key: RecipientKey, managers: Managers, fetch: Fetch, seen: dict[str, int] | None = None
    ) -> None:
        self.recipient_key = recipient_key
        self.public = recipient_public(recipient_key)
        self.managers = managers
        self._fetch = fetch
        self._keys: dict[tuple[str, int], ScopeKey] = {}
        self.names: dict[tuple[str, int], str] = {}  # the name a version's roster gives us
        self._newest: dict[str, int] = {}  # the newest version opened, which sealing uses
        self._misses: OrderedDict[tuple[str, int], tuple[float, str | None]] = OrderedDict()  # until, why
        # the newest version of each scope any verified roster named: none older is current (an
        # application that keeps it across restarts keeps that guarantee across them)
        self.seen: dict[str, int] = {} if seen is None else seen

    async def key(self, scope: str, version: int | None = None) -> ScopeKey | None:
        """A version (the newest by default); None when the broker has no envelope of it for us;
        SealError when what it serves is not what a pinned manager signed for us, or when the newest
        it serves is older than one seen before (a rollback)."""
        if version is None:
            version = self._newest.get(scope)
        if version is not None and (scope, version) in self._keys:
            return self._keys[(scope, version)]
        missed = self._misses.get((scope, version)) if version is not None else None
        if missed is not None and missed[0] > time.monotonic():
            if missed[1] is None:
                return None
            raise SealError(missed[1])
        try:
            answer = await self._fetch(scope, version)
            if answer is None:
                self._missed(scope, version, None)
                return None
            key, name = self._verified(scope, version, answer)
        except SealError as exc:
            self._missed(scope, version, str(exc))
            raise
        self._keys[(scope, key.version)] = key
        self.names[(scope, key.version)] = name
        self._newest[scope] = max(key.version, self._newest.get(scope, 0))
        return key

    def _missed(self, scope: str, version: int | None, error: str | None) -> None:
        """A version we hold no key of is not asked for again for a while (a scope's sealed
        publications reach subscribers outside it through its interface: one fetch each would be a
        request per delivery); the newest is always asked for."""
        if version is None:
            return
        # a version newer than any seen may be one a rotation just made, which this gateway has not
        # adopted yet (gateways follow each other's changes within seconds): asked again sooner
        wait = MISS_SECONDS if version <= self.seen.get(scope, 0) else NEW_MISS_SECONDS
        self._misses[(scope, version)] = (time.monotonic() + wait, error)
        self._misses.move_to_end((scope, version))
        while len(self._misses) > MAX_MISSES:
            self._misses.popitem(last=False)

    def _verified(self, scope: str, asked: int | None, answer: dict) -> tuple[ScopeKey, str]:
        roster = believed(answer, scope, self.managers.get(scope, {}), asked)
        try:
            envelope = base64.b64decode(answer.get("envelope", ""), validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise SealError(f"the broker's envelope of scope {scope!r} is malformed: {exc}") from None
        if asked is None and roster.version < self.seen.get(scope, 0):
            raise SealError(
                f"the broker served version {roster.version} of scope {scope!r} as the newest, "
                f"but version {self.seen[scope]} exists: a rollback"
            )
        name = next((member for member in roster.members if roster.holds(member, self.public, envelope)), None)
        if name is None:
            raise SealError(f"the signed roster of scope {scope!r} v{roster.version} gives you no such envelope")
        self.seen[scope] = max(roster.version, self.seen.get(scope, 0))
        return unwrap_envelope(envelope, scope, roster.version, self.recipient_key), name

    def forget_newest(self, scope: str) -> None:
        """After the broker refused the newest known version: a rotation happened since."""
        self._newest.pop(scope, None)

    async def open(self, publication: dict) -> bytes | None:
        """The publication's payload; None when it has none or we hold no key of its version (we are
        not a member of its scope, or were not when it was sealed); SealError when it was tampered
        with, or its key cannot be believed."""
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
        try:
            associated = associated_data(publication)
        except ValueError as exc:
            raise SealError(f"the publication's attributes cannot be what was sealed: {exc}") from None
        return open_sealed(raw, key, associated)
