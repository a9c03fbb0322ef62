"""PostgreSQL for the tests that run on it: the server VEIL_TEST_POSTGRES names (an administrator's
URL), else a throwaway one of the tests' own when PostgreSQL's binaries are installed. Without
either, those tests are skipped, unless VEIL_REQUIRE_POSTGRES=1 (CI sets it): then they fail.

The JVMs the suite starts (its brokers' Spark drivers, standalone masters and workers) live a
minute or two each: they compile with C1 only, which saves a start about a quarter of its 20 CPU
seconds, and on two cores shared by two workers CPU is what the suite waits for. A broker started
outside the suite (`veil serve`, the benchmarks) keeps the JVM's full tiered compilation.
JAVA_TOOL_OPTIONS set before the suite starts win."""

import os

import pytest

from tests.lanes import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401  (hooks, found by name)
from tests.prerequisites import missing
from veil.harness import PostgresServer, postgres_database
from veil.harness.postgres import binaries

os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


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
