"""Shamir (k, n) split and reconstruct of a 256-bit payload key (PLOS seed, S2 Fig. 8), Veil's
`veil.security.shamir` against pycryptodome's in the same run (which shares 16-byte secrets only:
a 32-byte key is two of its splits) and against the seed's Java figures.

    python -m bench.shamir
"""

from __future__ import annotations

import os
import secrets

from Crypto.Protocol.SecretSharing import Shamir

from bench.report import print_table
from bench.timing import per_call
from veil.security import shamir

SEED = {"split": 1.0, "reconstruct": 5.2}  # ms at 10 shares, S2 Fig. 8 (upper bounds read off the figure)
CASES = ((2, 3), (6, 10))




def pycryptodome_split(key: bytes, k: int, n: int) -> list[list[tuple[int, bytes]]]:
    return [Shamir.split(k, n, key[i : i + 16]) for i in range(0, len(key), 16)]


def pycryptodome_combine(parts: list[list[tuple[int, bytes]]], k: int) -> bytes:
    return b"".join(Shamir.combine(part[:k]) for part in parts)


def main() -> None:
    key = secrets.token_bytes(32)
    rows = []
    for k, n in CASES:
        shares = shamir.split(key, k, n)
        parts = pycryptodome_split(key, k, n)
        assert shamir.combine(shares[-k:]) == key and pycryptodome_combine(parts, k) == key
        rows.append(
            {
                "case": f"({k}, {n})",
                "veil split": per_call(lambda k=k, n=n: shamir.split(key, k, n)),
                "veil combine": per_call(lambda k=k, s=shares: shamir.combine(s[-k:])),
                "pcd split": per_call(lambda k=k, n=n: pycryptodome_split(key, k, n)),
                "pcd combine": per_call(lambda k=k, p=parts: pycryptodome_combine(p, k)),
                "seed": n == 10,
            }
        )
    print_table(
        f"Shamir on a 32-byte key, µs per call (median of 200); {os.cpu_count()} cores",
        [
            ("(k, n)", 8, lambda r: r["case"]),
            ("Veil split", 11, lambda r: f"{r['veil split']:.0f}"),
            ("Veil combine", 13, lambda r: f"{r['veil combine']:.0f}"),
            ("pycryptodome split", 19, lambda r: f"{r['pcd split']:.0f}"),
            ("pycryptodome combine", 21, lambda r: f"{r['pcd combine']:.0f}"),
            ("seed split", 11, lambda r: f"<{SEED['split'] * 1000:.0f}" if r["seed"] else None),
            ("seed combine", 13, lambda r: f"{SEED['reconstruct'] * 1000:.0f}" if r["seed"] else None),
        ],
        rows,
    )


if __name__ == "__main__":
    main()
