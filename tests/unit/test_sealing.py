"""Sealed payloads: members open them, nobody else does, nothing moves between scopes, publications
or key versions unnoticed, and a member who left cannot open what was sealed after the rotation.
Envelopes are RFC 9180 HPKE: an independent implementation (pyhpke) opens them, given only the
specification of their info."""

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, MLKEM768X25519PrivateKey, Suite
from hypothesis import given, settings
from hypothesis import strategies as st
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, KEMKey

from veil.security.sealing import (
    HybridKey,
    ScopeKey,
    SealError,
    open_sealed,
    recipient_public,
    seal,
    sealed_version,
    unwrap,
)
from veil.security.sealing import wrap as wrap_for


def wrap(key: ScopeKey, member: X25519PrivateKey | HybridKey) -> bytes:
    return wrap_for(key, recipient_public(member))


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
    envelopes = {name: wrap(first, member) for name, member in (("alice", alice), ("bob", bob))}
    before = seal(b"before", first)
    assert open_sealed(before, unwrap(envelopes["bob"], "customs", 1, bob)) == b"before"

    second = first.rotate()  # bob leaves: only alice gets the new key
    alice_key = unwrap(wrap(second, alice), "customs", 2, alice)
    after = seal(b"after", second)
    assert sealed_version(after) == 2 and open_sealed(after, alice_key) == b"after"
    bob_key = unwrap(envelopes["bob"], "customs", 1, bob)
    with pytest.raises(SealError, match="version 2"):
        open_sealed(after, bob_key)
    with pytest.raises(SealError, match="does not open"):
        open_sealed(after, bob_key._replace(version=2))


@pytest.mark.parametrize("kind", [X25519PrivateKey, HybridKey])
def test_a_key_envelope_opens_only_for_its_member_scope_and_version(kind):
    alice, mallory = kind.generate(), kind.generate()
    envelope = wrap(ScopeKey.new("customs"), alice)
    for scope, version, member in (("customs", 1, mallory), ("carriers", 1, alice), ("customs", 2, alice)):
        with pytest.raises(SealError, match="not for this member"):
            unwrap(envelope, scope, version, member)
    with pytest.raises(SealError, match="is not an"):
        unwrap(envelope[:-1], "customs", 1, alice)
    assert unwrap(envelope, "customs", 1, alice).version == 1


def test_an_envelope_with_a_low_order_encapsulated_key_is_a_seal_error():
    """(X25519 refuses such a point with a ValueError of its own: a member's client must see a SealError.)"""
    alice = X25519PrivateKey.generate()
    envelope = wrap(ScopeKey.new("customs"), alice)
    with pytest.raises(SealError, match="not for this member"):
        unwrap(bytes(32) + envelope[32:], "customs", 1, alice)


def spec_info(scope: str, version: int) -> bytes:
    """HPKE's info as the documentation specifies it, made without Veil's code."""
    return b"veil-scope-key-1\n" + rfc8785.dumps({"scope": scope, "version": version})


def test_an_independent_hpke_implementation_opens_a_veil_envelope():
    alice = X25519PrivateKey.generate()
    key = ScopeKey.new("customs-ü", 7)
    envelope = wrap(key, alice)
    suite = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.CHACHA20_POLY1305)
    context = suite.create_recipient_context(
        envelope[:32], KEMKey.from_pyca_cryptography_key(alice), info=spec_info("customs-ü", 7)
    )
    assert context.open(envelope[32:]) == key.secret


def test_a_hybrid_envelope_opens_with_rfc_9180_hpke_of_ml_kem_768_and_x25519():
    alice = HybridKey.generate()
    key = ScopeKey.new("customs", 2)
    envelope = wrap(key, alice)
    suite = Suite(KEM.MLKEM768_X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)
    private = MLKEM768X25519PrivateKey(alice.mlkem, alice.x25519)
    assert suite.decrypt(envelope, private, info=spec_info("customs", 2)) == key.secret
    with pytest.raises(SealError):  # the X25519 half alone opens nothing
        unwrap(envelope[-80:], "customs", 2, alice.x25519)
