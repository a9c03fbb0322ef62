"""A store URL's password, split off as libpq reads the URL, and redacted for log lines."""

import pytest

from veil.store.credentials import redacted, without_password


@pytest.mark.parametrize(
    ("url", "bare", "password"),
    [
        ("postgresql://veil:p%40ss@db:5432/veil?sslmode=verify-full", "postgresql://veil@db:5432/veil?sslmode=verify-full", "p@ss"),
        ("postgresql://veil:Tr0ub#4dor@db/veil", "postgresql://veil@db/veil", "Tr0ub#4dor"),
        ("postgresql://veil:a?b/c[d@db/veil", "postgresql://veil@db/veil", "a?b/c[d"),
        ("postgresql://veil@db/veil?password=zz&sslmode=require", "postgresql://veil@db/veil?sslmode=require", "zz"),
        ("postgresql://veil:x@db/veil?password=y", "postgresql://veil@db/veil", "y"),  # libpq takes the parameter
        ("postgresql://:pw@db/veil", "postgresql://db/veil", "pw"),
        ("postgresql://veil@db/veil", "postgresql://veil@db/veil", None),
        ("sqlite:///var/veil/veil.db", "sqlite:///var/veil/veil.db", None),
    ],
)
def test_the_password_is_split_off_as_libpq_reads_it_and_never_shown(url, bare, password):
    assert without_password(url) == (bare, password)
    if password is not None:
        assert password not in redacted(url) and "***" in redacted(url)
    assert "sslpassword=***" in redacted("postgresql://veil@db/veil?sslpassword=key-secret")
