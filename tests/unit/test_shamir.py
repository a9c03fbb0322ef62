"""Shamir sharing: any k of n shares give the secret back, and k - 1 of them reveal nothing (checked
exhaustively in a small field: every secret yields the same distribution of k - 1 shares)."""

import contextlib
import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.security.shamir import MAX_SECRET, Share, combine, combine_int, split, split_int


@settings(max_examples=200, deadline=None)
@given(
    secret=st.binary(max_size=MAX_SECRET),
    k_n=st.integers(1, 10).flatmap(lambda k: st.tuples(st.just(k), st.integers(k, 12))),
    data=st.data(),
)
def test_any_k_of_n_shares_reconstruct(secret, k_n, data):
    k, n = k_n
    shares = split(secret, k, n)
    assert len(shares) == n and len({s.index for s in shares}) == n
    chosen = data.draw(st.permutations(shares)).copy()[:k]
    assert combine(chosen) == secret
    assert combine([Share.from_bytes(s.to_bytes()) for s in chosen]) == secret


@pytest.mark.parametrize(("prime", "k"), [(7, 2), (7, 3), (5, 3)])
def test_fewer_than_k_shares_are_consistent_with_every_secret_equally(prime, k):
    """Over all polynomials (all choices of the random coefficients), the k - 1 shares of each secret
    take every value combination equally often: they carry no information about the secret."""
    n = prime - 1
    distributions = []
    for secret in range(prime):
        seen: Counter = Counter()
        for coefficients in itertools.product(range(prime), repeat=k - 1):
            points = [(x, sum(c * x**d for d, c in enumerate((secret, *coefficients))) % prime) for x in range(1, n + 1)]
            for subset in itertools.combinations(points, k - 1):
                seen[subset] += 1
        distributions.append(seen)
    assert all(distribution == distributions[0] for distribution in distributions)
    assert set(distributions[0].values()) == {1}


def test_the_integer_form_agrees_with_the_brute_force_polynomial():
    points = split_int(5, 3, 6, prime=13)
    for subset in itertools.combinations(points, 3):
        assert combine_int(subset, prime=13) == 5


def test_a_wrong_share_gives_a_wrong_secret_or_an_error_never_the_secret():
    secret = bytes(range(32))
    shares = split(secret, 2, 3)
    bad = shares[0]._replace(value=(shares[0].value + 1) % (2**521 - 1))
    with contextlib.suppress(ValueError):
        assert combine([bad, shares[1]]) != secret


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: split(b"x" * 65, 2, 3), "at most 64 bytes"),
        (lambda: split(b"x", 4, 3), "k <= n"),
        (lambda: split(b"x", 2, 300), "at most 255 shares"),
        (lambda: combine(split(b"x", 3, 5)[:2]), "3 needed"),
        (lambda: combine([Share(1, 2, 5), Share(1, 2, 6)]), "distinct"),
        (lambda: Share.from_bytes(b"\x00" * 68), "index and threshold"),
        (lambda: Share.from_bytes(b"\x01\x02"), "68 bytes"),
    ],
)
def test_bad_input_is_refused_with_the_reason(call, message):
    with pytest.raises(ValueError, match=message):
        call()
