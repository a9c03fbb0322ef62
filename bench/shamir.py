"""Shamir (k, n) split and reconstruct of a 256-bit payload key (PLOS seed, S2 Fig. 8), Veil's
`veil.security.shamir` against pycryptodome's in the same run (which shares 16-byte secrets only:
a 32-byte key is two of its splits). The paper's Java figures cannot be re-run here: they are printed
apart, as quoted figures (source in docs/performance/peers.md). pycryptodome comes with the `bench`
extra; without it only Veil's columns are measured.

    python -m bench.shamir
"""

from __future__ import annotations

import argparse
import os
import secrets
from types import ModuleType

from bench.report import print_quoted, print_table
from bench.timing import per_call
from veil.security import shamir

SEED = {"split": 1.0, "reconstruct": 5.2}  # ms at 10 shares, quoted: S2 Fig. 8 ("well under 1 ms"; 5.2 on average)
CASES = ((2, 3), (6, 10))


def pycryptodome_split(sharing: ModuleType, key: bytes, k: int, n: int) -> list[list[tuple[int, bytes]]]:
    return [sharing.Shamir.split(k, n, key[i : i + 16]) for i in range(0, len(key), 16)]


def pycryptodome_combine(sharing: ModuleType, parts: list[list[tuple[int, bytes]]], k: int) -> bytes:
    return b"".join(sharing.Shamir.combine(part[:k]) for part in parts)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    try:
        from Crypto.Protocol import SecretSharing as sharing
    except ModuleNotFoundError:
        sharing = None
    key = secrets.token_bytes(32)
    rows = []
    for k, n in CASES:
        shares = shamir.split(key, k, n)
        assert shamir.combine(shares[-k:]) == key
        row = {
            "case": f"({k}, {n})",
            "veil split": per_call(lambda k=k, n=n: shamir.split(key, k, n)),
            "veil combine": per_call(lambda k=k, s=shares: shamir.combine(s[-k:])),
        }
        if sharing is not None:
            parts = pycryptodome_split(sharing, key, k, n)
            assert pycryptodome_combine(sharing, parts, k) == key
            row["pcd split"] = per_call(lambda k=k, n=n: pycryptodome_split(sharing, key, k, n))
            row["pcd combine"] = per_call(lambda k=k, p=parts: pycryptodome_combine(sharing, p, k))
        rows.append(row)
    print_table(
        f"Shamir on a 32-byte key, µs per call (median of 200); {os.cpu_count()} cores",
        [
            ("(k, n)", 8, lambda r: r["case"]),
            ("Veil split", 11, lambda r: f"{r['veil split']:.0f}"),
            ("Veil combine", 13, lambda r: f"{r['veil combine']:.0f}"),
            ("pycryptodome split", 19, lambda r: f"{r['pcd split']:.0f}" if "pcd split" in r else None),
            ("pycryptodome combine", 21, lambda r: f"{r['pcd combine']:.0f}" if "pcd combine" in r else None),
        ],
        rows,
    )
    if sharing is None:
        print('pycryptodome is missing, so its columns are not measured (`pip install -e ".[bench]"` adds it)')
    print_quoted(
        "secret sharing in the PADRES broker (Java, Core2 Duo T5550), 10 shares",
        [
            ("split", f"<{SEED['split'] * 1000:.0f} µs", "S2 Fig. 8"),
            ("reconstruct", f"{SEED['reconstruct'] * 1000:.0f} µs", "S2 Fig. 8"),
        ],
    )


if __name__ == "__main__":
    main()
