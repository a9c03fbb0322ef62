"""Revoked client certificates: a certificate revocation list (CRL) file that the operator keeps,
read again whenever it changes, so that revoking a certificate takes effect without a restart.

A list counts only if a CA of the client CA bundle signed it (the CAs client certificates are
verified against), so that whoever can write the file cannot lock clients out with a list of their
own making. The broker looks a client's certificate up each time the certificate proves something:
every request and every delivery handshake. A list that cannot be read or does not verify is
refused at start; later, the last good list stays in force and the log says why the new one was not
taken (replace the file atomically, by a rename, so the broker never reads half of it).
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache

from cryptography import x509

log = logging.getLogger("veil.security")
PEM_CRL = b"-----BEGIN X509 CRL-----"


class RevocationList:
    def __init__(self, path: str, client_ca: str) -> None:
        self.path = path
        try:
            with open(client_ca, "rb") as handle:
                self._issuers = x509.load_pem_x509_certificates(handle.read())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--client-ca {client_ca}: {exc}") from None
        self._seen: tuple[int, int, int] | None = None  # the file's (inode, size, mtime) when last read
        self._revoked: dict[bytes, frozenset[int]] = {}  # issuer name (DER) -> revoked serial numbers
        try:
            self._revoked = self._read()
        except (OSError, ValueError) as exc:
            raise ValueError(f"--crl {path}: {exc}") from None

    def revoked(self, certificate: bytes) -> bool:
        """Whether the list in force names this (DER) certificate."""
        self._refresh()
        if not self._revoked:
            return False
        parsed = _certificate(certificate)
        serials = self._revoked.get(parsed.issuer.public_bytes())
        return serials is not None and parsed.serial_number in serials

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if self._seen is not None:
                log.error("--crl %s: %s; the last list read stays in force", self.path, exc)
                self._seen = None
            return
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self._revoked = self._read()
        except (OSError, ValueError) as exc:
            log.error("--crl %s: %s; the last list read stays in force", self.path, exc)
            return
        log.info("--crl %s: %d revoked certificates", self.path, sum(map(len, self._revoked.values())))

    def _read(self) -> dict[bytes, frozenset[int]]:
        with open(self.path, "rb") as handle:
            raw = handle.read()
        if PEM_CRL in raw:
            lists = [x509.load_pem_x509_crl(PEM_CRL + part) for part in raw.split(PEM_CRL)[1:]]
        else:
            lists = [x509.load_der_x509_crl(raw)]
        revoked: dict[bytes, frozenset[int]] = {}
        for crl in lists:
            issuer = crl.issuer.public_bytes()
            if not any(ca.subject == crl.issuer and _signed_by(crl, ca) for ca in self._issuers):
                raise ValueError(f"a list issued by {crl.issuer.rfc4514_string()} not signed by a --client-ca CA")
            revoked[issuer] = revoked.get(issuer, frozenset()) | {entry.serial_number for entry in crl}
        return revoked


def _signed_by(crl: x509.CertificateRevocationList, ca: x509.Certificate) -> bool:
    try:
        return crl.is_signature_valid(ca.public_key())  # type: ignore[arg-type]  # a key that cannot sign: below
    except TypeError:  # a key type that cannot sign a list
        return False


@lru_cache(maxsize=1024)
def _certificate(der: bytes) -> x509.Certificate:
    """Parsed once: a client presents the same certificate on every connection."""
    return x509.load_der_x509_certificate(der)
