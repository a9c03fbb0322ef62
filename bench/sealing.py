"""Sealing a payload for a scope and opening it (`veil.security.sealing`), per publication, and
wrapping the scope key for one member, in µs (median of 2,000 calls).

    python -m bench.sealing
"""

from __future__ import annotations

import argparse
import os

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from bench.report import print_table
from bench.timing import per_call
from veil.security.sealing import ScopeKey, open_sealed, seal, unwrap, wrap

ATTRIBUTES = b'{"lat":52.1,"lon":4.3,"sensor":"NO2"}'  # what a sealed publication stays routable by


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    key = ScopeKey.new("customs")
    member = X25519PrivateKey.generate()
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
    envelope = wrap(key, member.public_key())
    wrapping = per_call(lambda: wrap(key, member.public_key()), 2000)
    unwrapping = per_call(lambda: unwrap(envelope, "customs", 1, member), 2000)
    print_table(
        f"Sealed payloads, µs per call (median of 2,000); {os.cpu_count()} cores; "
        f"a scope key is wrapped for a member in {wrapping:.0f} µs and unwrapped in {unwrapping:.0f} µs",
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
