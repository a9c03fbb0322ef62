"""Credentials over their lifetime, in-process: the revocation list as the broker reads it (reloaded
when replaced, and only when a client CA signed it), a revoked certificate refused, a token's
expiry carried with its principal, the announce privilege and the monitoring handshake's reading of
duplicate keys."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from veil.matching import Predicate
from veil.matching.covering import covered_by_any
from veil.monitoring.selis import is_monitor
from veil.protocol import ProtocolError
from veil.security import certs
from veil.security.admission import admit_announcement
from veil.security.identity import Authenticator, Credentials, Principal, TokenVerifier
from veil.security.registry import parse_registry
from veil.security.revocation import RevocationList
from veil.security.tls import fingerprint


def der(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, f"client-{name}.pem"), "rb") as handle:
        return x509.load_pem_x509_certificate(handle.read()).public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("ca"))
    certs.create(directory, ["localhost"], ["alice", "mallory"])
    return directory


def test_the_list_is_read_again_when_replaced_and_a_bad_one_leaves_the_last_good_one_in_force(ca, tmp_path):
    crl = certs.revoke(ca, [])
    revocations = RevocationList(crl, os.path.join(ca, "ca.pem"))
    assert not revocations.revoked(der(ca, "mallory"))
    certs.revoke(ca, ["mallory"])
    assert revocations.revoked(der(ca, "mallory")) and not revocations.revoked(der(ca, "alice"))
    stranger = str(tmp_path / "stranger")
    certs.create(stranger, ["localhost"], ["alice"])
    os.replace(certs.revoke(stranger, []), crl)  # signed by a CA the broker does not trust
    assert revocations.revoked(der(ca, "mallory"))
    with open(crl, "wb") as handle:
        handle.write(b"not a list")
    assert revocations.revoked(der(ca, "mallory"))
    certs.revoke(ca, [])
    assert not revocations.revoked(der(ca, "mallory"))


def test_a_list_the_client_ca_did_not_sign_is_refused_at_start(ca, tmp_path):
    stranger = str(tmp_path / "stranger")
    certs.create(stranger, ["localhost"], ["alice"])
    with pytest.raises(ValueError, match=r"--crl .*not signed by a --client-ca CA"):
        RevocationList(certs.revoke(stranger, []), os.path.join(ca, "ca.pem"))


def test_a_revoked_certificate_proves_nothing(ca):
    revoked = {der(ca, "mallory")}
    auth = Authenticator(frozenset({"certificate"}), False, None, lambda: parse_registry({}), revoked.__contains__)
    alice = der(ca, "alice")
    assert auth.identify(Credentials(fingerprint(alice), certificate=alice)) == fingerprint(alice)
    mallory = der(ca, "mallory")
    with pytest.raises(ProtocolError) as refused:
        auth.identify(Credentials(fingerprint(mallory), certificate=mallory))
    assert (refused.value.status, refused.value.field) == (401, "certificate")


def test_a_token_principal_carries_the_tokens_expiry(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k", "alg": "ES256"}]}))
    verifier = TokenVerifier(str(tmp_path / "jwks.json"))
    exp = int(time.time()) + 60
    token = jwt.encode({"sub": "ann", "exp": exp}, key, algorithm="ES256", headers={"kid": "k"})
    auth = Authenticator(frozenset({"token", "hash"}), False, verifier, lambda: parse_registry({}))
    assert auth.principal(Credentials(token=token)) == Principal("ann", expires=float(exp))
    registry = parse_registry({"hashes": {"static-secret": "sam"}})
    assert Authenticator(frozenset({"hash"}), False, None, lambda: registry).principal(
        Credentials(claimed="static-secret")
    ).expires is None  # fmt: skip


def test_the_announce_section_names_the_field_of_a_mistake():
    for doc, field in (({"announce": []}, "announce"), ({"announce": {"ed": [{"key": "x"}]}}, "announce.ed[0]")):
        with pytest.raises(ProtocolError) as refused:
            parse_registry(doc)
        assert refused.value.field.startswith(field)


def test_announcing_takes_a_filter_of_the_announcer_or_of_anyone():
    registry = parse_registry(
        {
            "announce": {
                "ed": [[{"key": "type", "val": "air", "op": "eq"}]],
                "*": [[{"key": "open", "val": 1, "op": "eq"}]],
            }
        }
    )
    admit_announcement(registry, Principal("ed"), [Predicate("type", "eq", "air"), Predicate("co", "gt", 2)])
    admit_announcement(registry, Principal("zoe"), [Predicate("open", "eq", 1)])
    with pytest.raises(ProtocolError) as refused:
        admit_announcement(registry, Principal("ed"), [Predicate("type", "eq", "water")])
    assert (refused.value.status, refused.value.field) == (403, "data")
    with pytest.raises(ProtocolError) as refused:
        admit_announcement(parse_registry({}), Principal("ed"), [])
    assert (refused.value.status, refused.value.field) == (403, "authHash")


VALUES = st.integers(-3, 3)
CONSTRAINTS = st.builds(Predicate, st.sampled_from(["a", "b"]), st.sampled_from(["eq", "gt", "le"]), VALUES)


@given(allowed=st.lists(st.lists(CONSTRAINTS, max_size=2), max_size=2), announced=st.lists(CONSTRAINTS, max_size=3))
def test_an_announcement_is_admitted_exactly_when_a_filter_covers_it(allowed, announced):
    doc = [[{"key": p.key, "op": p.op, "val": p.value} for p in f] for f in allowed]
    registry = parse_registry({"announce": {"ed": doc}})
    try:
        admit_announcement(registry, Principal("ed"), announced)
        admitted = True
    except ProtocolError:
        admitted = False
    assert admitted == covered_by_any(registry.announce_filters_of("ed"), announced)


def test_the_monitoring_handshake_is_read_like_every_handshake():
    gateway = SimpleNamespace(metrics_hash="monitor-secret")
    assert is_monitor(gateway, b'{"authHash": "monitor-secret"}')  # type: ignore[arg-type]
    assert not is_monitor(gateway, b'{"authHash": "other", "authHash": "monitor-secret"}')  # type: ignore[arg-type]
