"""Development certificates: a CA, a server certificate for the given host names, client certificates,
and the CA's revocation list.

For local TLS and tests only; production deployments bring certificates from their own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from veil.security.attributes import extension
from veil.security.tls import fingerprint

VALIDITY = datetime.timedelta(days=825)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    with open(f"{path}.pem", "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(f"{path}-key.pem", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def create(
    directory: str, hostnames: list[str], clients: list[str], attributes: dict[str, dict[str, Any]] | None = None
) -> dict[str, str]:
    """Write ca.pem, server.pem and client-NAME.pem (each with its -key.pem); returns the client
    names' fingerprints, which are their authHash values. `attributes` (client name -> what
    `security.attributes` reads) makes those clients' certificates attribute certificates."""
    os.makedirs(directory, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Veil development CA")])
    ca = (
        _builder("Veil development CA", ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(os.path.join(directory, "ca"), ca_key, ca)
    server_key = _key()
    server = (
        _builder(hostnames[0], ca_name, server_key.public_key())
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hostnames]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(os.path.join(directory, "server"), server_key, server)
    identities = {}
    for name in clients:
        client_key = _key()
        builder = _builder(name, ca_name, client_key.public_key()).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        if attributes and name in attributes:
            builder = builder.add_extension(extension(attributes[name]), critical=False)
        client = builder.sign(ca_key, hashes.SHA256())
        _write(os.path.join(directory, f"client-{name}"), client_key, client)
        identities[name] = fingerprint(client.public_bytes(serialization.Encoding.DER))
    return identities


def revoke(directory: str, clients: list[str]) -> str:
    """Write crl.pem, the CA's list revoking these clients' certificates (none: an empty list), by a
    rename, so that a broker reading it (`--crl`) never sees half a file; returns its path."""
    with open(os.path.join(directory, "ca.pem"), "rb") as handle:
        ca = x509.load_pem_x509_certificate(handle.read())
    with open(os.path.join(directory, "ca-key.pem"), "rb") as handle:
        ca_key = serialization.load_pem_private_key(handle.read(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory}/ca-key.pem: not the key of a CA this module made")
    now = datetime.datetime.now(datetime.UTC)
    builder = x509.CertificateRevocationListBuilder().issuer_name(ca.subject).last_update(now)
    builder = builder.next_update(now + datetime.timedelta(days=1))
    for name in clients:
        with open(os.path.join(directory, f"client-{name}.pem"), "rb") as handle:
            serial = x509.load_pem_x509_certificate(handle.read()).serial_number
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
        )
    path = os.path.join(directory, "crl.pem")
    with open(f"{path}.new", "wb") as handle:
        handle.write(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    os.replace(f"{path}.new", path)
    return path
