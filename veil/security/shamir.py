"""Shamir's (k, n) secret sharing over a prime field, for secret forwarding: a payload key split into
n shares that travel through n independently operated brokers, any k of which reconstruct it while
any k - 1 reveal nothing about it (every secret is consistent with them through exactly one
polynomial).

The field is GF(2^521 - 1), a Mersenne prime: a secret of up to 64 bytes (a key, or a key and a
nonce) fits in one field element, so a share is one element however long the key. Written here
rather than taken from a library: `cryptography` has no secret sharing, and pycryptodome's works on
16-byte secrets in GF(2^128) only; the arithmetic is Python's own big integers (`pow(x, -1, p)`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import NamedTuple

PRIME = 2**521 - 1
MAX_SECRET = 64  # bytes: with the marker byte, 520 bits, below the prime
MAX_SHARES = 255
VALUE_BYTES = 66  # a field element, big-endian


class Share(NamedTuple):
    # the x at which the polynomial was evaluated, 1..n; the scheme's name for it shadows tuple.index,
    # which no share uses
    index: int  # type: ignore[assignment]
    threshold: int  # k: how many shares reconstruct the secret
    value: int  # the polynomial at `index`

    def to_bytes(self) -> bytes:
        return bytes((self.index, self.threshold)) + self.value.to_bytes(VALUE_BYTES, "big")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Share:
        if len(raw) != 2 + VALUE_BYTES:
            raise ValueError(f"a share is {2 + VALUE_BYTES} bytes, not {len(raw)}")
        share = cls(raw[0], raw[1], int.from_bytes(raw[2:], "big"))
        if min(share.index, share.threshold) < 1 or share.value >= PRIME:
            raise ValueError("not a share: index and threshold start at 1, the value is below the prime")
        return share


def split_int(secret: int, k: int, n: int, prime: int = PRIME) -> list[tuple[int, int]]:
    """The points (x, f(x)) for x = 1..n of a random polynomial f of degree k - 1 with f(0) = secret."""
    if not 1 <= k <= n < prime:
        raise ValueError(f"need 1 <= k <= n < the field's size; got k={k}, n={n}")
    if not 0 <= secret < prime:
        raise ValueError("the secret must be a field element")
    coefficients = [secret] + [secrets.randbelow(prime) for _ in range(k - 1)]
    points = []
    for x in range(1, n + 1):
        y = 0
        for coefficient in reversed(coefficients):  # Horner
            y = (y * x + coefficient) % prime
        points.append((x, y))
    return points


def combine_int(points: Sequence[tuple[int, int]], prime: int = PRIME) -> int:
    """f(0) of the polynomial of degree len(points) - 1 through the points (Lagrange at zero)."""
    xs = [x % prime for x, _ in points]
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("shares need distinct, nonzero indices")
    secret = 0
    for i, (x_i, y_i) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (x_j, _) in enumerate(points):
            if i != j:
                numerator = numerator * x_j % prime
                denominator = denominator * (x_j - x_i) % prime
        secret = (secret + y_i * numerator * pow(denominator, -1, prime)) % prime
    return secret


def split(secret: bytes, k: int, n: int) -> list[Share]:
    """n shares of up to 64 bytes, any k of which give them back."""
    if len(secret) > MAX_SECRET:
        raise ValueError(f"a secret of at most {MAX_SECRET} bytes (share a key, not a payload)")
    if n > MAX_SHARES:
        raise ValueError(f"at most {MAX_SHARES} shares")
    value = int.from_bytes(b"\x01" + secret, "big")  # the marker keeps leading zero bytes
    return [Share(x, k, y) for x, y in split_int(value, k, n)]


def combine(shares: Sequence[Share]) -> bytes:
    """The secret from the first k shares (k as the shares say); ValueError if fewer, or if they
    disagree on k. Wrong shares give a wrong secret, not an error: the caller checks the result (an
    authenticated decryption with it fails) and tries other subsets."""
    if not shares:
        raise ValueError("no shares")
    k = shares[0].threshold
    if any(share.threshold != k for share in shares):
        raise ValueError("the shares disagree on their threshold")
    if len(shares) < k:
        raise ValueError(f"{len(shares)} shares, {k} needed")
    value = combine_int([(share.index, share.value) for share in shares[:k]])
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1 or len(raw) > MAX_SECRET + 1:
        raise ValueError("the shares do not combine to a secret (some of them are wrong)")
    return raw[1:]
