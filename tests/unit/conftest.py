import pytest

from veil.store import open_store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """A fresh store of each dialect: the store's tests run on both."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else f"sqlite:///{tmp_path}/veil.db"
    s = open_store(url)
    yield s
    s.close()
