import pytest

from veil.harness import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One plain broker shared by a test module (Spark starts once per module)."""
    process = BrokerProcess(str(tmp_path_factory.mktemp("broker"))).start()
    yield process
    process.close()
