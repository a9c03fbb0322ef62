import shutil

import pytest

from tests.prerequisites import missing
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


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing("Chromium and its driver are not installed (Debian: apt-get install chromium chromium-driver)",
                "VEIL_REQUIRE_BROWSER")  # fmt: skip
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1200"):  # fmt: skip
        options.add_argument(argument)
    session = webdriver.Chrome(options=options, service=Service(driver))
    yield session
    session.quit()
