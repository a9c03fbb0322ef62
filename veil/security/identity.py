"""Who a client is (SPEC §3), the same way on REST, TCP delivery and WebSocket.

An identity is proved by a client certificate under mutual TLS (its SHA-256 fingerprint), by a
bearer token an identity provider signed (its subject), or, where the operator allows it for
development, by a static hash: a secret declared in the registry's `hashes` section, which proves
the user it maps to (`hash`), or any hash at all, taken as the user's name (`any-hash`, the SELIS
server's behaviour). Whatever else a request claims (the authHash of the SELIS protocol) must
agree with what was proved. Without any credentials a client is anonymous, if the operator allows
that, and refused otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jwt

from veil.protocol import ProtocolError
from veil.security.attributes import NONE, Attributes, from_certificate, from_claims
from veil.security.registry import ANONYMOUS, Registry

METHODS = ("certificate", "token", "hash", "any-hash")
TOKEN_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY = 30  # seconds of clock skew tolerated on exp / nbf
VERIFIED_LIMIT = 4096  # tokens remembered as verified, until they expire


@dataclass(frozen=True)
class Credentials:
    fingerprint: str | None = None  # of a verified client certificate
    token: str | None = None  # bearer token
    claimed: str | None = None  # the authHash the request names
    certificate: bytes | None = None  # the verified client certificate (DER), for its attributes


class Principal(NamedTuple):
    identity: str
    attributes: Attributes = NONE
    expires: float | None = None  # when the proving token expires (Unix time); None: it does not


class TokenVerifier:
    """Verifies bearer tokens against the identity provider's public keys (a JWKS file or URL):
    signature, expiry, and the issuer and audience when configured."""

    def __init__(self, jwks: str, issuer: str | None = None, audience: str | None = None) -> None:
        self.issuer = issuer
        self.audience = audience
        # A publisher sends the same token with every request: its signature is checked once, and
        # the token is then taken for its subject until it expires.
        self._verified: dict[str, tuple[Principal, float]] = {}
        self._client: jwt.PyJWKClient | None = None
        self._keys: jwt.PyJWKSet | None = None
        if jwks.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(jwks, cache_jwk_set=True, lifespan=300)
        else:
            try:
                with open(jwks, encoding="utf-8") as handle:
                    self._keys = jwt.PyJWKSet.from_dict(json.load(handle))
            except (OSError, ValueError, jwt.PyJWKError, jwt.PyJWKSetError) as exc:
                raise ValueError(f"--jwks {jwks}: {exc}") from None

    def verify(self, token: str) -> Principal:
        """The token's subject and the attributes of its `veil` claim."""
        known = self._verified.get(token)
        if known is not None and known[1] + LEEWAY > time.time():
            return known[0]
        try:
            key = self._key(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=TOKEN_ALGORITHMS,
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise ProtocolError("token", "expired", 401) from None
        except jwt.InvalidAudienceError:
            raise ProtocolError("token", f"not issued for this broker (audience {self.audience!r})", 401) from None
        except jwt.InvalidIssuerError:
            raise ProtocolError("token", f"not issued by {self.issuer!r}", 401) from None
        except jwt.InvalidSignatureError:
            raise ProtocolError("token", "signature does not verify", 401) from None
        except jwt.PyJWTError as exc:
            raise ProtocolError("token", f"invalid: {exc}", 401) from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise ProtocolError("token", "its subject is not a non-empty string", 401)
        expires = float(claims["exp"])
        principal = Principal(subject, from_claims(claims), expires)
        if len(self._verified) >= VERIFIED_LIMIT:
            self._verified.clear()
        self._verified[token] = (principal, expires)
        return principal

    def _key(self, token: str) -> jwt.PyJWK:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token)
        assert self._keys is not None
        kid = jwt.get_unverified_header(token).get("kid")
        if kid is None and len(self._keys.keys) == 1:
            return self._keys.keys[0]
        try:
            return self._keys[kid if isinstance(kid, str) else ""]
        except KeyError:
            raise jwt.InvalidTokenError(f"no key {kid!r} in the identity provider's key set") from None


class Authenticator:
    def __init__(
        self,
        methods: frozenset[str],
        anonymous: bool,
        tokens: TokenVerifier | None,
        registry: Callable[[], Registry],
        revoked: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.methods = methods
        self.anonymous = anonymous
        self.tokens = tokens
        self._registry = registry
        self._revoked = revoked  # whether a (verified) client certificate has been revoked since

    def identify(self, credentials: Credentials) -> str:
        """The identity the credentials prove; ProtocolError (401, or 403 for a contradiction)."""
        return self.principal(credentials).identity

    def principal(self, credentials: Credentials) -> Principal:
        """The identity the credentials prove and the attributes the proving credentials carry (a
        static hash carries none)."""
        identity = None
        attributes = NONE
        expires = None
        revoked = self._revoked
        if credentials.certificate is not None and revoked is not None and revoked(credentials.certificate):
            raise ProtocolError("certificate", "revoked (listed in the broker's certificate revocation list)", 401)
        if credentials.fingerprint is not None and "certificate" in self.methods:
            identity = credentials.fingerprint
            if credentials.certificate is not None:
                attributes = from_certificate(credentials.certificate)
        if credentials.token is not None:
            if "token" not in self.methods or self.tokens is None:
                raise ProtocolError("token", "bearer tokens are not accepted by this broker", 401)
            subject, stated, expires = self.tokens.verify(credentials.token)
            if identity is not None and subject != identity:
                raise ProtocolError("token", "its subject is not the client certificate's identity", 403)
            identity = subject
            attributes = attributes.merge(stated)
        claimed = credentials.claimed
        if claimed is not None:
            if identity is not None:
                if claimed != identity:
                    proof = "bearer token" if credentials.token is not None else "client certificate"
                    raise ProtocolError("authHash", f"does not match the {proof}", 403)
            elif "hash" in self.methods and (user := self._registry().user_of_hash(claimed)) is not None:
                identity = user
            elif "any-hash" in self.methods:
                identity = claimed
            elif "hash" in self.methods:
                raise ProtocolError("authHash", "not a static hash the registry declares (its hashes section)", 401)
            else:
                raise ProtocolError(
                    "authHash", "static hashes are not accepted: use a client certificate or a bearer token", 401
                )
        if identity is not None:
            return Principal(identity, attributes, expires)
        if self.anonymous:
            return Principal(ANONYMOUS)
        raise ProtocolError("authHash", "authentication required (client certificate, bearer token or authHash)", 401)
