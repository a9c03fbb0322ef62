import pytest

from veil.harness import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One plain broker shared by a test module (Spark starts once per module)."""
    process = BrokerProcess(str(tmp_path_factory.mktemp("broker"))).start()
    yield process
    process.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_flags(request) -> tuple[str, ...]:
    """`veil serve` flags for each store dialect: the embedded default, and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return ()
    return ("--store", request.getfixturevalue("postgres_url"))
