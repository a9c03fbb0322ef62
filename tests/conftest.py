"""PostgreSQL for the tests that run on it: the server VEIL_TEST_POSTGRES names (an administrator's
URL), else a throwaway one of the tests' own when PostgreSQL's binaries are installed. Without
either, those tests are skipped, unless VEIL_REQUIRE_POSTGRES=1 (CI sets it): then they fail.

The suite runs on two pytest-xdist workers (`-n 2 --dist loadgroup`): every test of
tests/integration in one group, so that one worker runs them in turn, while the other runs the
in-process tests (tests/unit, tests/gateway). The integration tests start brokers and time their
faults and latencies on a machine they take to be theirs: two of them at once on two cores would
each take the other's. The ones that time nothing go first, while the in-process tests still run
beside them."""

import os

import pytest

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


# Integration modules that count what survives restarts and kills rather than time anything: they
# run while the other worker still runs the in-process tests
FIRST = ("test_durability.py", "test_readme.py", "test_idempotency.py", "test_partitioning.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "integration":
            item.add_marker(pytest.mark.xdist_group("integration"))
    # stable: each module's tests stay together and in their order
    items.sort(key=lambda item: item.path.parent.name == "integration" and item.path.name not in FIRST)
