"""The store's array parameters on PostgreSQL reach the server as the values they were: numpy
arrays through `postgres_arrays`' binary dumper, lists through psycopg's binary list dumpers."""

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.store.postgres import _placeholders
from veil.store.postgres_arrays import register

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.fixture(scope="module")
def connection(postgres_server):
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        register(conn.adapters)
        yield conn


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(INT64, max_size=300))
def test_a_numpy_array_arrives_whole_and_in_order(connection, values):
    array = np.array(values, np.int64)
    got = connection.execute(_placeholders("SELECT ?::bigint[], cardinality(?::bigint[])"), (array, array)).fetchone()
    assert got == (values, len(values))


def test_arrays_of_other_shapes_and_types_arrive_as_their_values(connection):
    strided = np.arange(10, dtype=np.int64)[::3]  # not contiguous
    small = np.array([1, -2, 3], np.int32)  # widened, not reinterpreted
    got = connection.execute(
        _placeholders("SELECT ?::bigint[], ?::bigint[], j.a, j.b FROM unnest(?::bigint[], ?::bigint[]) AS j(a, b)"),
        (strided, small, np.array([7]), np.array([8])),
    ).fetchone()
    assert got == ([0, 3, 6, 9], [1, -2, 3], 7, 8)
    top = np.array([2**63 - 1], np.uint64)
    assert connection.execute(_placeholders("SELECT ?::bigint[]"), (top,)).fetchone() == ([2**63 - 1],)


@pytest.mark.parametrize(
    "array",
    [
        np.array([2**63 + 5], np.uint64),  # would wrap round
        np.array([2.7, -2.7]),  # would be truncated
        np.array([True, False]),
        np.array([1, 2**70], object),
        np.array([[1, 2], [3, 4]], np.int64),  # would be flattened
        np.array(7, np.int64),  # a scalar, not an array
        np.ma.masked_array([1, 2, 3], mask=[False, True, False]),  # the mask would be dropped
    ],
    ids=["uint64-beyond", "float", "bool", "object", "2-d", "0-d", "masked"],
)
def test_an_array_that_is_not_one_of_integers_in_range_is_refused(connection, array):
    """Not sent as something else: a value that would change on the way is an error, as it is for
    what psycopg cannot adapt."""
    with pytest.raises(psycopg.DataError):
        connection.execute(_placeholders("SELECT ?::bigint[]"), (array,))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=20),
    names=st.lists(st.none() | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30), max_size=20),
    numbers=st.lists(INT64, max_size=20),
)
def test_lists_sent_binary_arrive_as_their_values(connection, bodies, names, numbers):
    """A group commit's columns: bodies of any bytes, texts with NULLs among them (keyless
    publications), numbers of any size. Texts are what JSON decodes to: no lone surrogates."""
    sql = _placeholders("SELECT ?::bytea[], ?::text[], ?::bigint[]")
    assert "%b" in sql
    assert connection.execute(sql, (bodies, names, numbers)).fetchone() == (bodies, names, numbers)
