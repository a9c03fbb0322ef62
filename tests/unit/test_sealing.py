"""Sealed payloads: members open them, nobody else does, nothing moves between scopes, publications
or key versions unnoticed, and a member who left cannot open what was sealed after the rotation."""

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.security.sealing import ScopeKey, SealError, open_sealed, seal, sealed_version, unwrap, wrap


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=4096), associated=st.binary(max_size=256))
def test_a_member_opens_what_was_sealed_for_the_scope(payload, associated):
    key = ScopeKey.new("customs")
    sealed = seal(payload, key, associated)
    assert len(payload) < 16 or payload not in sealed  # a few bytes may turn up in any ciphertext by chance
    assert open_sealed(sealed, key, associated) == payload


def test_sealed_payloads_do_not_move_or_change_unnoticed():
    key = ScopeKey.new("customs")
    sealed = seal(b"manifest 4711", key, b'{"port":"Rotterdam"}')
    with pytest.raises(SealError, match="does not open"):
        open_sealed(sealed, key, b'{"port":"Hamburg"}')  # another publication's attributes
    with pytest.raises(SealError, match="does not open"):
        open_sealed(sealed, ScopeKey("carriers", key.version, key.secret), b'{"port":"Rotterdam"}')
    tampered = bytearray(sealed)
    tampered[-1] ^= 1
    with pytest.raises(SealError, match="does not open"):
        open_sealed(bytes(tampered), key, b'{"port":"Rotterdam"}')
    with pytest.raises(SealError, match="too short"):
        open_sealed(sealed[:20], key)


def test_a_member_removed_cannot_open_what_is_sealed_after_the_rotation():
    alice, bob = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    first = ScopeKey.new("customs")
    envelopes = {name: wrap(first, member.public_key()) for name, member in (("alice", alice), ("bob", bob))}
    before = seal(b"before", first)
    assert open_sealed(before, unwrap(envelopes["bob"], "customs", 1, bob)) == b"before"

    second = first.rotate()  # bob leaves: only alice gets the new key
    alice_key = unwrap(wrap(second, alice.public_key()), "customs", 2, alice)
    after = seal(b"after", second)
    assert sealed_version(after) == 2 and open_sealed(after, alice_key) == b"after"
    bob_key = unwrap(envelopes["bob"], "customs", 1, bob)
    with pytest.raises(SealError, match="version 2"):
        open_sealed(after, bob_key)
    with pytest.raises(SealError, match="does not open"):
        open_sealed(after, bob_key._replace(version=2))


def test_a_key_envelope_opens_only_for_its_member_scope_and_version():
    alice, mallory = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    envelope = wrap(ScopeKey.new("customs"), alice.public_key())
    for scope, version, member in (("customs", 1, mallory), ("carriers", 1, alice), ("customs", 2, alice)):
        with pytest.raises(SealError, match="not for this member"):
            unwrap(envelope, scope, version, member)
    with pytest.raises(SealError, match="not a key envelope"):
        unwrap(envelope[:-1], "customs", 1, alice)


def test_an_envelope_with_a_low_order_ephemeral_key_is_a_seal_error():
    """(X25519 refuses such a point with a ValueError of its own: a member's client must see a SealError.)"""
    alice = X25519PrivateKey.generate()
    envelope = wrap(ScopeKey.new("customs"), alice.public_key())
    with pytest.raises(SealError, match="no valid ephemeral key"):
        unwrap(bytes(32) + envelope[32:], "customs", 1, alice)
