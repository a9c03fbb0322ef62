"""Signed rosters against a hostile broker, in-process: a member's keyring believes only what a
manager it pins signed for it, and no version older than one it has seen; a manager's rotation
wraps only for recipient keys it vouches for. The broker here is a function that answers what the
test makes it answer."""

import base64
import contextlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.client.scope_keys import next_version
from veil.client.sealed import ScopeKeyring, associated_data, seal_publication
from veil.protocol import ProtocolError
from veil.security.rosters import parse_signed
from veil.security.sealing import ScopeKey, SealError, open_sealed, recipient_public, unwrap, wrap

CAROL = Ed25519PrivateKey.generate()  # the manager members pin
MALLORY = Ed25519PrivateKey.generate()  # a key of the broker's operator
PINNED = {"customs": {"carol-1": CAROL.public_key().public_bytes_raw()}}
MEMBERS = {name: X25519PrivateKey.generate() for name in ("alice", "bob", "dave")}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def described(version: int = 0, roster: dict | None = None, **keys: X25519PrivateKey) -> dict:
    members = {name: b64(recipient_public(key)) for name, key in (keys or MEMBERS).items()}
    return {"scope": "customs", "version": version, "members": members, "roster": roster}


ALL = object()  # the manager vouches for every member's true key


def rotation(previous: dict | None = None, signer=CAROL, vouched=ALL, seen: int = 0, **keys):
    version = 0 if previous is None else previous["roster"]["version"]
    vouched = {n: recipient_public(k) for n, k in MEMBERS.items()} if vouched is ALL else vouched
    doc = described(version, previous, **keys)
    return next_version("customs", doc, ("carol-1", signer), vouched, PINNED["customs"], seen)


def answer(body: dict, member: str) -> dict:
    """What GET /scopes/customs/key answers `member` for a stored version `body`."""
    signed = {k: body[k] for k in ("roster", "keyId", "signature")}
    return {"scope": "customs", "version": body["roster"]["version"], "envelope": body["envelopes"][member], **signed}


def keyring(member: str, serve, pinned=PINNED) -> ScopeKeyring:
    async def fetch(scope, version):
        return serve(scope, version)

    return ScopeKeyring(MEMBERS[member], pinned, fetch)


async def test_a_member_takes_the_key_a_pinned_manager_signed_for_it():
    body, done = rotation()
    assert done.version == 1 and done.members == ("alice", "bob", "dave") and not done.left_out
    key = await keyring("alice", lambda *_: answer(body, "alice")).key("customs")
    assert key.version == 1
    assert unwrap(base64.b64decode(body["envelopes"]["bob"]), "customs", 1, MEMBERS["bob"]) == key


async def test_a_broker_cannot_hand_out_a_key_it_chose_or_a_roster_nobody_pinned_signed():
    body, _ = rotation()
    chosen = ScopeKey.new("customs")
    forged = answer(body, "alice") | {"envelope": b64(wrap_for_alice(chosen))}
    with pytest.raises(SealError, match="gives you no such envelope"):
        await keyring("alice", lambda *_: forged).key("customs")
    own, _ = rotation(signer=MALLORY)  # a roster of the broker's making, with envelopes of its key
    with pytest.raises(SealError, match="not signed by a manager you pin"):
        await keyring("alice", lambda *_: answer(own, "alice")).key("customs")
    edited = answer(body, "alice")
    edited["roster"] = {**edited["roster"], "version": 9}  # a signed roster altered
    with pytest.raises(SealError, match="not signed by a manager you pin"):
        await keyring("alice", lambda *_: edited).key("customs")
    with pytest.raises(SealError, match="gives you no such envelope"):  # bob's envelope, offered to alice
        await keyring("alice", lambda *_: answer(body, "bob")).key("customs")
    with pytest.raises(SealError, match="no manager key of scope 'customs' is pinned"):
        await keyring("alice", lambda *_: answer(body, "alice"), pinned={}).key("customs")


def wrap_for_alice(key: ScopeKey) -> bytes:
    return wrap(key, recipient_public(MEMBERS["alice"]))


async def test_a_member_refuses_a_version_older_than_one_it_saw():
    first, _ = rotation()
    second, _ = rotation(first)
    served = {"now": answer(second, "alice")}
    ring = keyring("alice", lambda *_: served["now"])
    assert (await ring.key("customs")).version == 2
    ring.forget_newest("customs")  # as after a 409: the broker is asked for the newest again
    served["now"] = answer(first, "alice")  # and rolls back to a version a departed member holds
    with pytest.raises(SealError, match="rollback"):
        await ring.key("customs")
    assert (await keyring("alice", lambda *_: answer(first, "alice")).key("customs", 1)).version == 1


def test_a_rotation_wraps_only_for_recipient_keys_the_manager_vouches_for():
    first, _ = rotation(vouched={n: recipient_public(MEMBERS[n]) for n in ("alice", "bob")})
    assert set(first["envelopes"]) == {"alice", "bob"}  # dave: the registry lists him, nobody vouched
    swapped = X25519PrivateKey.generate()  # the broker swaps bob's key and adds mallory
    body, done = rotation(first, vouched=None, alice=MEMBERS["alice"], bob=swapped, mallory=swapped)
    assert done.members == ("alice",)
    assert "another recipient key" in done.left_out["bob"] and "not on the last roster" in done.left_out["mallory"]
    assert set(body["envelopes"]) == {"alice"}
    # bob left, but the broker keeps listing him: the manager's own list of recipients decides
    vouched = {"alice": recipient_public(MEMBERS["alice"])}
    body, done = rotation(first, vouched=vouched, alice=MEMBERS["alice"], bob=MEMBERS["bob"])
    assert done.members == ("alice",) and "not among the recipients you gave" in done.left_out["bob"]
    forged, _ = rotation(signer=MALLORY)
    with pytest.raises(SealError, match="not signed by a manager you pin"):
        rotation(forged)
    with pytest.raises(SealError, match="version 5 exists"):  # an old roster served to re-issue its successor
        rotation(first, seen=5)


async def test_a_sealed_payload_is_bound_to_its_canonical_attributes():
    key = ScopeKey.new("customs")
    sealed = seal_publication({"b": 1.0, "a": "ü"}, b"manifest", key, "alice")
    origin = sealed["veil:origin"]
    assert origin["publisher"] == "alice" and len(base64.b64decode(origin["id"])) == 16
    reordered = {"veil:sealed": sealed["veil:sealed"], "veil:scope": "customs", "a": "ü", "b": 1, "veil:origin": origin}
    raw = base64.b64decode(sealed["veil:sealed"])
    expected = '{"a":"ü","b":1,"veil:origin":{"id":"%s","publisher":"alice","time":%d},"veil:scope":"customs"}'
    assert associated_data(reordered) == (expected % (origin["id"], origin["time"])).encode()
    assert open_sealed(raw, key, associated_data(reordered)) == b"manifest"
    with pytest.raises(ValueError, match="canonical"):
        seal_publication({"n": 2**60}, b"x", key, "alice")


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_whatever_a_broker_serves_as_a_roster_is_a_roster_or_a_protocol_error(doc):
    for candidate in (doc, {"roster": doc, "keyId": "k", "signature": b64(bytes(64))}):
        with contextlib.suppress(ProtocolError):
            parse_signed(candidate, "roster")


async def test_a_version_the_broker_has_no_key_of_for_us_is_not_asked_for_on_every_delivery():
    asked = []

    def serve(scope, version):
        asked.append(version)
        return None

    ring = keyring("alice", serve)
    assert [await ring.key("customs", 3) for _ in range(5)] == [None] * 5 and asked == [3]
    assert await ring.key("customs") is None and asked == [3, None]  # the newest is always asked for
