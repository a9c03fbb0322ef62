"""A scope manager's side of scope keys: the next version's roster, made only from what the manager
can vouch for, since the broker's list of members and recipient keys is the broker's word.

Given `recipients` (member -> recipient public key, from wherever the manager learns keys and
membership it believes), exactly those members get the new key, each if the registry lists it in
the scope with that very key: so a member the broker keeps listing after it left, one it added and
one whose key it swapped are all left out, and reported. Without `recipients`, the members on the
previous roster (which must verify against a manager key the manager pins) keep the keys it lists,
as long as the broker still lists them: removals are then the broker's word. A manager never builds
on a version older than one it has seen, so a broker cannot have it re-issue an old version.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from veil.security.rosters import Roster, believed, envelope_digest, sign_roster
from veil.security.sealing import ScopeKey, SealError, wrap


class Rotation(NamedTuple):
    version: int
    members: tuple[str, ...]  # who got the new key
    left_out: dict[str, str]  # member the registry lists -> why it did not get the key


def next_version(
    scope: str,
    described: dict,
    signing_key: tuple[str, Ed25519PrivateKey],
    recipients: Mapping[str, bytes] | None,
    pinned: Mapping[str, bytes],
    seen: int = 0,
) -> tuple[dict, Rotation]:
    """The body of `PUT /scopes/{scope}/keys/{version}` after `described` (`GET /scopes/{scope}`),
    and what it does; SealError when the current roster is not one a pinned manager signed, or is
    older than version `seen`."""
    version = described.get("version") if isinstance(described, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise SealError(f"the broker described scope {scope!r} without a key version")
    if version < seen:
        raise SealError(f"the broker says scope {scope!r} is at version {version}, but version {seen} exists")
    vouched: dict[str, bytes] = {}
    if described.get("roster") is not None:
        vouched.update(believed(described["roster"], scope, pinned, version).members)
    elif version:
        raise SealError(f"the broker has version {version} of scope {scope!r} but no roster of it")
    if recipients is not None:
        vouched = dict(recipients)
    key = ScopeKey.new(scope, version + 1)
    members: dict[str, bytes] = {}
    left_out: dict[str, str] = {}
    listed = described.get("members")
    for member, text in (listed if isinstance(listed, dict) else {}).items():
        try:
            public = base64.b64decode(text, validate=True) if isinstance(text, str) else None
        except (binascii.Error, ValueError):
            public = None
        if public is None:
            left_out[member] = "the registry lists no recipient key for it"
        elif member not in vouched:
            left_out[member] = (
                "not among the recipients you gave" if recipients is not None else "not on the last roster"
            )
        elif vouched[member] != public:
            left_out[member] = "the registry lists another recipient key than the one vouched for"
        else:
            members[member] = public
    for member in vouched.keys() - members.keys() - left_out.keys():
        left_out[member] = "the registry does not list it in the scope"
    if not members:
        raise SealError(f"no member of scope {scope!r} has a recipient key you vouch for: {left_out}")
    envelopes = {member: wrap(key, public) for member, public in members.items()}
    roster = Roster(scope, key.version, members, {m: envelope_digest(e) for m, e in envelopes.items()})
    body = sign_roster(roster, *signing_key).document()
    body["envelopes"] = {m: base64.b64encode(e).decode() for m, e in envelopes.items()}
    return body, Rotation(key.version, tuple(sorted(members)), left_out)
