"""What a client's credentials say it may do beyond who it is (seed 003's attribute certificates):
the scopes it is admitted into and the filters it may subscribe with.

The authority that signed the credential states them, so the broker trusts them as far as it trusts
that signature: in a client certificate (issued by the CA the broker verifies clients against) as
an X.509 extension whose value is UTF-8 JSON, or in a bearer token (signed by the identity
provider) as the claim `veil`:

    {"scopes": ["customs"], "subscribe": [[{"key": "country", "op": "eq", "val": "FR"}]]}

`subscribe` absent means the credential sets no bound on subscriptions; present, every
subscription of the client must be covered by one of its filters (`[]` is everything).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cryptography import x509

from veil.protocol import ProtocolError
from veil.security.registry import parse_filter
from veil.security.scopes import Filters

# an OID of the UUID arc (ITU-T X.667): Veil's own, needing no registration
OID = x509.ObjectIdentifier("2.25.227523289030799493685583208544263721643")
CLAIM = "veil"
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Attributes:
    scopes: frozenset[str] = frozenset()
    subscribe: Filters | None = None

    def merge(self, other: Attributes) -> Attributes:
        """What two credentials of one client say together: the scopes of both, and the bounds that
        either sets (a credential that sets none does not lift the other's)."""
        if other.subscribe is None or self.subscribe is None:
            subscribe = self.subscribe if other.subscribe is None else other.subscribe
        else:
            subscribe = self.subscribe + other.subscribe
        return Attributes(self.scopes | other.scopes, subscribe)


NONE = Attributes()


def parse_attributes(doc: object, where: str) -> Attributes:
    if not isinstance(doc, dict):
        raise ProtocolError(where, 'an object {"scopes": [names], "subscribe": [filters]}', 401)
    extra = sorted(set(doc) - {"scopes", "subscribe"})
    if extra:
        raise ProtocolError(f"{where}.{extra[0]}", "unknown attribute; use scopes, subscribe", 401)
    scopes = doc.get("scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) and s for s in scopes):
        raise ProtocolError(f"{where}.scopes", "a list of scope names", 401)
    subscribe = doc.get("subscribe")
    if subscribe is not None:
        if not isinstance(subscribe, list):
            raise ProtocolError(f"{where}.subscribe", "a list of filters, each a list of constraints", 401)
        try:
            subscribe = tuple(parse_filter(f, f"{where}.subscribe[{i}]") for i, f in enumerate(subscribe))
        except ProtocolError as exc:
            raise ProtocolError(exc.field, exc.problem, 401) from None
    return Attributes(frozenset(scopes), subscribe)


@lru_cache(maxsize=1024)
def from_certificate(der: bytes) -> Attributes:
    """The attributes a (verified) client certificate carries; cached, since a client presents the
    same certificate on every connection."""
    try:
        extension = x509.load_der_x509_certificate(der).extensions.get_extension_for_oid(OID)
    except x509.ExtensionNotFound:
        return NONE
    value = extension.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(raw) > MAX_BYTES:
        raise ProtocolError("certificate", f"its Veil attributes extension is over {MAX_BYTES} bytes", 401)
    try:
        doc = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("certificate", "its Veil attributes extension is not UTF-8 JSON", 401) from None
    return parse_attributes(doc, "certificate.attributes")


def from_claims(claims: dict[str, Any]) -> Attributes:
    return parse_attributes(claims[CLAIM], f"token.{CLAIM}") if CLAIM in claims else NONE


def extension(doc: dict[str, Any]) -> x509.UnrecognizedExtension:
    """The certificate extension stating `doc` (for a CA issuing attribute-bearing certificates)."""
    return x509.UnrecognizedExtension(OID, json.dumps(doc, separators=(",", ":")).encode())
