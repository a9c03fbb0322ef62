"""Shamir sharing: any k of n shares give the secret back, and k - 1 of them reveal nothing. Secrecy is
checked on `split_int` itself: its random coefficients are replaced by every possible tuple in a small
field, so the shares it returns are enumerated over all polynomials and compared secret by secret."""

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.security import shamir
from veil.security.shamir import MAX_SECRET, PRIME, Share, combine, combine_int, split, split_int


class _ChosenCoefficients:
    """Stands in for the `secrets` module inside `veil.security.shamir`, so that the coefficients
    `split_int` draws are the ones a test chose, and the draws themselves can be checked."""

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.bounds: list[int] = []

    def randbelow(self, bound: int) -> int:
        self.bounds.append(bound)
        return self.queue.pop(0)


@contextlib.contextmanager
def chosen_coefficients() -> Iterator[_ChosenCoefficients]:
    source = _ChosenCoefficients()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shamir, "secrets", source)
        yield source


def split_with(
    source: _ChosenCoefficients, coefficients: Sequence[int], secret: int, k: int, n: int, prime: int
) -> list[tuple[int, int]]:
    """`split_int` with its random coefficients (lowest degree first) set; it must draw each of them once,
    uniformly from the whole field, or the enumeration would not cover every polynomial it can pick."""
    source.queue, source.bounds = list(coefficients), []
    points = split_int(secret, k, n, prime=prime)
    assert source.queue == [] and source.bounds == [prime] * (k - 1)
    return points


def brute_force(coefficients: Sequence[int], x: int, prime: int) -> int:
    return sum(c * x**degree for degree, c in enumerate(coefficients)) % prime


def chi_square(counts: Counter, cells: int) -> float:
    total = sum(counts.values())
    expected = total / cells
    return sum((counts.get(cell, 0) - expected) ** 2 / expected for cell in range(cells))


@settings(max_examples=200, deadline=None)
@given(
    secret=st.binary(max_size=MAX_SECRET),
    k_n=st.integers(1, 10).flatmap(lambda k: st.tuples(st.just(k), st.integers(k, 12))),
    data=st.data(),
)
def test_any_k_of_n_shares_reconstruct(secret: bytes, k_n: tuple[int, int], data: st.DataObject) -> None:
    k, n = k_n
    shares = split(secret, k, n)
    assert len(shares) == n and len({s.index for s in shares}) == n
    chosen = data.draw(st.permutations(shares)).copy()[:k]
    assert combine(chosen) == secret
    assert combine([Share.from_bytes(s.to_bytes()) for s in chosen]) == secret


@pytest.mark.parametrize(("prime", "k", "n"), [(7, 2, 6), (7, 3, 6), (5, 3, 4), (5, 4, 4)])
def test_fewer_than_k_shares_from_split_int_are_distributed_alike_for_every_secret(prime: int, k: int, n: int) -> None:
    """Over every polynomial `split_int` can pick, any k - 1 of its shares take each combination of
    values exactly once, whatever the secret: they carry no information about it."""
    distributions = []
    with chosen_coefficients() as source:
        for secret in range(prime):
            seen: Counter = Counter()
            for coefficients in itertools.product(range(prime), repeat=k - 1):
                points = split_with(source, coefficients, secret, k, n, prime)
                assert [x for x, _ in points] == list(range(1, n + 1))
                for subset in itertools.combinations(points, k - 1):
                    seen[subset] += 1
            distributions.append(seen)
    assert all(distribution == distributions[0] for distribution in distributions)
    positions = len(list(itertools.combinations(range(n), k - 1)))
    assert len(distributions[0]) == positions * prime ** (k - 1)
    assert set(distributions[0].values()) == {1}


@settings(max_examples=100, deadline=None)
@given(
    prime=st.sampled_from([13, 257, PRIME]),
    data=st.data(),
)
def test_split_int_evaluates_the_polynomial_its_coefficients_define(prime: int, data: st.DataObject) -> None:
    """Each share is f(x) = secret + c1 x + c2 x^2 + ... summed term by term (not by Horner's rule, as
    the implementation does), and any k of them interpolate back to the secret."""
    k = data.draw(st.integers(1, 5))
    n = data.draw(st.integers(k, min(8, prime - 1)))
    secret = data.draw(st.integers(0, prime - 1))
    coefficients = data.draw(st.lists(st.integers(0, prime - 1), min_size=k - 1, max_size=k - 1))
    with chosen_coefficients() as source:
        points = split_with(source, coefficients, secret, k, n, prime)
    assert points == [(x, brute_force([secret, *coefficients], x, prime)) for x in range(1, n + 1)]
    for subset in itertools.combinations(points, k):
        assert combine_int(subset, prime=prime) == secret


def test_shares_of_one_secret_are_fresh_on_every_call() -> None:
    """The coefficients come from a random source on every call: the same secret split twice gives
    unrelated shares, none of which is the secret itself."""
    secret = int.from_bytes(b"\x01" + bytes(range(32)), "big")
    calls = [split_int(secret, 3, 5) for _ in range(200)]
    for position in range(5):
        values = [points[position][1] for points in calls]
        assert len(set(values)) == len(values)
        assert secret not in values
    shares = [split(bytes(range(32)), 2, 3) for _ in range(50)]
    assert len({tuple(share.value for share in call) for call in shares}) == 50


def test_k_minus_1_shares_look_uniform_over_real_draws() -> None:
    """With the real random source, two of the shares of a (3, 4) split over GF(7) fall in all 49
    value pairs evenly, for a secret of 0 as for 6: chi-square over 9,800 splits each, against the
    critical value of 48 degrees of freedom at p = 1e-6 (so a correct implementation fails about once
    in a million runs)."""
    for secret in (0, 6):
        counts = Counter(
            points[0][1] * 7 + points[3][1] for points in (split_int(secret, 3, 4, prime=7) for _ in range(9800))
        )
        assert chi_square(counts, 49) < 110, (secret, counts)


def test_a_wrong_share_gives_a_wrong_secret_or_an_error_never_the_secret() -> None:
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
def test_bad_input_is_refused_with_the_reason(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
