"""Sealing a payload for a scope and opening it (`veil.security.sealing`), per publication, the
canonical form of its attributes the seal is bound to, and wrapping the scope key for one member
(HPKE with X25519, or the hybrid ML-KEM-768 + X25519), in µs (median of 2,000 calls).

    python -m bench.sealing
"""

from __future__ import annotations

import argparse
import os

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from bench.report import print_table
from bench.timing import per_call
from veil.client.sealed import associated_data
from veil.security.sealing import HybridKey, ScopeKey, open_sealed, recipient_public, seal, unwrap, wrap

ROUTED = {"lat": 52.1, "lon": 4.3, "sensor": "NO2", "veil:scope": "customs"}  # what it stays routable by
ATTRIBUTES = associated_data(ROUTED)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    key = ScopeKey.new("customs")
    rows = []
    for size in (256, 4096, 65536):
        payload = os.urandom(size)
        sealed = seal(payload, key, ATTRIBUTES)
        rows.append(
            {
                "size": size,
                "seal": per_call(lambda p=payload: seal(p, key, ATTRIBUTES), 2000),
                "open": per_call(lambda s=sealed: open_sealed(s, key, ATTRIBUTES), 2000),
                "overhead": len(sealed) - size,
            }
        )
    canonical = per_call(lambda: associated_data(ROUTED), 2000)
    wrapped = []
    for name, member in (("X25519", X25519PrivateKey.generate()), ("hybrid", HybridKey.generate())):
        public = recipient_public(member)
        envelope = wrap(key, public)
        wrapping = per_call(lambda p=public: wrap(key, p), 2000)
        unwrapping = per_call(lambda e=envelope, m=member: unwrap(e, "customs", 1, m), 2000)
        timing = f"wrapped in {wrapping:.0f} µs, unwrapped in {unwrapping:.0f} µs"
        wrapped.append(f"{name}: {timing} ({len(envelope)} bytes)")
    print_table(
        f"Sealed payloads, µs per call (median of 2,000); {os.cpu_count()} cores; the attributes' canonical "
        f"form takes {canonical:.1f} µs; a scope key for a member, {'; '.join(wrapped)}",
        [
            ("payload bytes", 14, lambda r: r["size"]),
            ("seal µs", 8, lambda r: f"{r['seal']:.1f}"),
            ("open µs", 8, lambda r: f"{r['open']:.1f}"),
            ("bytes added", 12, lambda r: r["overhead"]),
        ],
        rows,
    )


if __name__ == "__main__":
    main()
