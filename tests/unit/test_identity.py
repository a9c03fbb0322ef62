"""Which proofs of identity a broker accepts, and what a request may claim beside them."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from veil.protocol import ProtocolError
from veil.security.attributes import NONE, Attributes
from veil.security.identity import Authenticator, Credentials, TokenVerifier
from veil.security.registry import ANONYMOUS, parse_registry
from veil.security.tls import fingerprint

REGISTRY = parse_registry({"hashes": {"dev-secret-1": "dev"}, "users": {"dev": {}, "alice": {}}})


def authenticator(methods: str, anonymous: bool = False, tokens: TokenVerifier | None = None) -> Authenticator:
    return Authenticator(frozenset(methods.split(",")), anonymous, tokens, lambda: REGISTRY)


def refused(auth: Authenticator, credentials: Credentials) -> ProtocolError:
    with pytest.raises(ProtocolError) as error:
        auth.identify(credentials)
    return error.value


def test_static_hashes_only_where_allowed():
    assert authenticator("hash").identify(Credentials(claimed="dev-secret-1")) == "dev"
    assert refused(authenticator("hash"), Credentials(claimed="stranger")).status == 401


def test_a_user_id_is_not_a_static_hash():
    """Names (user ids, certificate fingerprints, token subjects) are not secrets: only a declared
    hash proves its user, whichever methods are on."""
    auth = authenticator("certificate,token,hash")
    for name in ("dev", "alice"):
        assert refused(auth, Credentials(claimed=name)).status == 401
    assert auth.identify(Credentials(claimed="dev-secret-1")) == "dev"
    assert authenticator("any-hash").identify(Credentials(claimed="stranger")) == "stranger"
    assert refused(authenticator("certificate,token"), Credentials(claimed="dev")).field == "authHash"


def test_a_claim_must_agree_with_the_certificate():
    auth = authenticator("certificate,any-hash")
    assert auth.identify(Credentials(fingerprint="fp", claimed="fp")) == "fp"
    assert auth.identify(Credentials(fingerprint="fp")) == "fp"
    assert refused(auth, Credentials(fingerprint="fp", claimed="someone")).status == 403


def test_anonymous_only_when_configured():
    assert authenticator("hash", anonymous=True).identify(Credentials()) == ANONYMOUS
    assert refused(authenticator("hash"), Credentials()).status == 401


def test_bearer_tokens(tmp_path):
    key = ed25519.Ed25519PrivateKey.generate()
    jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k", "alg": "EdDSA"}]}))
    tokens = TokenVerifier(str(tmp_path / "jwks.json"), issuer="idp", audience="veil")

    def token(**claims: object) -> str:
        base = {"sub": "alice", "iss": "idp", "aud": "veil", "exp": int(time.time()) + 60}
        return jwt.encode({**base, **claims}, key, algorithm="EdDSA", headers={"kid": "k"})

    auth = authenticator("token", tokens=tokens)
    assert auth.identify(Credentials(token=token())) == "alice"
    assert auth.identify(Credentials(token=token(), claimed="alice")) == "alice"
    assert refused(auth, Credentials(token=token(), claimed="bob")).status == 403
    assert "expired" in refused(auth, Credentials(token=token(exp=int(time.time()) - 100))).problem
    assert "audience" in refused(auth, Credentials(token=token(aud="other"))).problem
    assert refused(auth, Credentials(token=jwt.encode({"sub": "x"}, key, algorithm="EdDSA"))).field == "token"
    assert refused(authenticator("hash"), Credentials(token=token())).field == "token"
    with pytest.raises(ValueError, match="--jwks"):
        TokenVerifier(str(tmp_path / "missing.json"))


def test_attributes_come_from_the_credentials_that_prove_the_identity(tmp_path):
    """An attribute certificate's extension and a token's `veil` claim state scopes and the filters
    a client may subscribe with; a static hash states nothing."""
    from veil.security.certs import create

    doc = {"scopes": ["customs"], "subscribe": [[{"key": "country", "op": "eq", "val": "FR"}]]}
    create(str(tmp_path), ["localhost"], ["alice", "bob"], {"alice": doc})
    der = {name: x509.load_pem_x509_certificate((tmp_path / f"client-{name}.pem").read_bytes()).public_bytes(
        serialization.Encoding.DER) for name in ("alice", "bob")}  # fmt: skip
    auth = authenticator("certificate,hash")
    alice = auth.principal(Credentials(fingerprint=fingerprint(der["alice"]), certificate=der["alice"]))
    assert alice.identity == fingerprint(der["alice"])
    assert alice.attributes.scopes == {"customs"}
    assert [[tuple(p) for p in f] for f in alice.attributes.subscribe] == [[("country", "eq", "FR")]]
    bob = auth.principal(Credentials(fingerprint=fingerprint(der["bob"]), certificate=der["bob"]))
    assert bob.attributes == NONE
    assert auth.principal(Credentials(claimed="dev-secret-1")).attributes == NONE

    key = ed25519.Ed25519PrivateKey.generate()
    jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k", "alg": "EdDSA"}]}))
    tokens = authenticator("token", tokens=TokenVerifier(str(tmp_path / "jwks.json")))

    def token(**claims: object) -> str:
        return jwt.encode({"sub": "carol", "exp": int(time.time()) + 60, **claims}, key, "EdDSA", {"kid": "k"})

    assert tokens.principal(Credentials(token=token(veil={"scopes": ["a", "b"]}))).attributes.scopes == {"a", "b"}
    assert tokens.principal(Credentials(token=token())).attributes == NONE
    bad = refused(tokens, Credentials(token=token(veil={"scopes": "customs"})))
    assert (bad.field, bad.status) == ("token.veil.scopes", 401)
    bad = refused(tokens, Credentials(token=token(veil={"subscribe": [[{"key": "k", "op": "zz", "val": 1}]]})))
    assert bad.field.startswith("token.veil.subscribe[0][0]") and bad.status == 401


def test_two_credentials_state_attributes_together():
    one = Attributes(frozenset({"a"}), ((),))
    other = Attributes(frozenset({"b"}))
    assert one.merge(other) == Attributes(frozenset({"a", "b"}), ((),))
    assert other.merge(one).subscribe == ((),)
    assert one.merge(one).subscribe == ((), ())
