"""The JavaScript client (clients/js) against a real broker (one for the module): its own test suite
under Node, and the same scenarios in headless Chromium, from a page of another origin that the
broker's --cors-origin allows (REST over fetch, deliveries over WebSocket)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.prerequisites import missing
from tests.readme import blocks
from veil.harness import BrokerProcess
from veil.harness.broker import free_ports

pytestmark = pytest.mark.slow
CLIENT = os.path.join(os.path.dirname(__file__), "..", "..", "clients", "js")
NODE_MAJOR = 20  # the oldest Node the client supports


@pytest.fixture(scope="module")
def built() -> str:
    """The client built (its dependencies, TypeScript alone, installed first if they are not)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing("Node.js and npm are not installed (Debian: apt-get install nodejs npm)", "VEIL_REQUIRE_NODE")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < NODE_MAJOR:
        missing(f"Node {version} is older than the client's {NODE_MAJOR}", "VEIL_REQUIRE_NODE")
    if not os.path.isdir(os.path.join(CLIENT, "node_modules")):
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True, capture_output=True, timeout=300)
    subprocess.run([npm, "run", "build"], cwd=CLIENT, check=True, capture_output=True, timeout=300)
    return npm


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    """The client's directory served over HTTP: the browser tests' origin."""
    (port,) = free_ports(1)
    handler = functools.partial(_Quiet, directory=CLIENT)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def js_broker(tmp_path_factory, page: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(str(tmp_path_factory.mktemp("js-broker")), "--cors-origin", page).start()
    yield process
    process.close()


def test_the_clients_suite_passes_under_node(built: str, js_broker: BrokerProcess) -> None:
    environment = {**os.environ, "VEIL_URL": js_broker.url, "VEIL_WS_URL": f"ws://127.0.0.1:{js_broker.ws_port}/"}
    result = subprocess.run(
        [built, "test"], cwd=CLIENT, env=environment, capture_output=True, text=True, timeout=600
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout and "# pass 5" in result.stdout, result.stdout[-3000:]


def test_the_same_scenarios_pass_in_headless_chromium(built: str, js_broker: BrokerProcess, page: str, browser) -> None:
    from selenium.webdriver.common.by import By

    ws = f"ws://127.0.0.1:{js_broker.ws_port}/"
    browser.get(f"{page}/test/browser.html?url={js_broker.url}&ws={ws}")
    deadline = time.monotonic() + 300
    while browser.find_element(By.TAG_NAME, "body").get_attribute("data-done") != "true":
        assert time.monotonic() < deadline, browser.find_element(By.ID, "results").text
        time.sleep(0.2)
    outcomes = json.loads(browser.find_element(By.ID, "results").text)
    assert len(outcomes) == 5 and all(outcome == "ok" for outcome in outcomes.values()), outcomes


def test_the_readmes_example_runs_as_written(built: str, js_broker: BrokerProcess) -> None:
    """The example a newcomer pastes, in a file of the client's package (so that `veil-client` names
    it, as it would once installed), against this module's broker."""
    (example,) = [block for block in blocks()[0] if block.kind == "javascript"]
    path = os.path.join(CLIENT, "readme-example.mjs")
    with open(path, "w") as handle:
        handle.write(example.text.replace("http://localhost:20000", js_broker.url))
    try:  # (the delivery port is the one /subscribe names)
        result = subprocess.run(
            ["node", "--experimental-websocket", path], cwd=CLIENT, capture_output=True, text=True, timeout=120
        )  # fmt: skip
    finally:
        os.remove(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " alice { berth: 4, vessel: 'Nordic Star' }" in result.stdout, result.stdout
