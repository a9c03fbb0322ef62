"""A development identity provider: a signing key in a directory, its public key as the JWKS that
`veil serve --jwks` reads, and bearer tokens signed with it (`veil token`). Production brokers
take tokens from the organisation's own provider; this one exists so that the token path can be
tried, and tested, end to end without one."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

KEY_FILE = "signing-key.pem"
JWKS_FILE = "jwks.json"
KID = "veil-dev-1"


def _key(directory: str) -> ec.EllipticCurvePrivateKey:
    """The directory's signing key, made (with its JWKS beside it) the first time."""
    path = os.path.join(directory, KEY_FILE)
    if os.path.exists(path):
        with open(path, "rb") as handle:
            key = serialization.load_pem_private_key(handle.read(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{path}: not an EC private key")
        return key
    os.makedirs(directory, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    with open(os.path.join(directory, JWKS_FILE), "w", encoding="utf-8") as handle:
        json.dump({"keys": [{**jwk, "kid": KID, "alg": "ES256", "use": "sig"}]}, handle)
    return key


def mint(
    directory: str,
    subject: str,
    ttl: float = 3600,
    issuer: str | None = None,
    audience: str | None = None,
    attributes: dict[str, Any] | None = None,
) -> str:
    """A token for `subject`, valid `ttl` seconds; `attributes` go in the `veil` claim (scopes, subscribe)."""
    claims: dict[str, Any] = {"sub": subject, "iat": int(time.time()), "exp": int(time.time() + ttl)}
    if issuer is not None:
        claims["iss"] = issuer
    if audience is not None:
        claims["aud"] = audience
    if attributes is not None:
        claims["veil"] = attributes
    return jwt.encode(claims, _key(directory), algorithm="ES256", headers={"kid": KID})
