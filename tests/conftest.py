"""PostgreSQL for the tests that run on it: the server VEIL_TEST_POSTGRES names (an administrator's
URL), else a throwaway one of the tests' own when PostgreSQL's binaries are installed. Without
either, those tests are skipped, unless VEIL_REQUIRE_POSTGRES=1 (CI sets it): then they fail."""

import os

import pytest

from tests.lanes import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401  (hooks, found by name)
from tests.prerequisites import missing
from veil.harness import PostgresServer, postgres_database
from veil.harness.postgres import binaries


@pytest.fixture(scope="session")
def postgres_server():
    url = os.environ.get("VEIL_TEST_POSTGRES")
    if url:
        yield url
        return
    if binaries() is None:
        missing("PostgreSQL is not installed and VEIL_TEST_POSTGRES is not set", "VEIL_REQUIRE_POSTGRES")
    server = PostgresServer().start()
    yield server.url
    server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """The URL of a new, empty database, dropped after the test."""
    with postgres_database(postgres_server) as url:
        yield url
