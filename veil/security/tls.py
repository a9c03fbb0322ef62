"""TLS contexts for the listeners and the identity a client certificate proves.

The identity of a certificate is the SHA-256 fingerprint of its DER encoding (SPEC §3), the same
value a client uses as its authHash.
"""

from __future__ import annotations

import hashlib
import ssl


def server_context(certificate: str, private_key: str, client_ca: str | None, require_client: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, private_key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca_file: str | None, certificate: str | None = None, private_key: str | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    if certificate:
        context.load_cert_chain(certificate, private_key)
    return context


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> bytes | None:
    """The verified client certificate (DER), or None without one."""
    return (ssl_object.getpeercert(binary_form=True) or None) if ssl_object is not None else None
