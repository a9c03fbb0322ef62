"""The deployment files: the compose file's services start what they claim, with flags `veil serve`
accepts and addresses that agree with each other (`docker compose config` too, where docker is)."""

import argparse
import os
import shutil
import subprocess
import urllib.parse

import pytest
import yaml

from tests.prerequisites import missing
from veil import config
from veil.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "deploy", "compose.yaml")


@pytest.fixture(scope="module")
def services() -> dict:
    with open(COMPOSE) as handle:
        return yaml.safe_load(handle)["services"]


def veil_config(service: dict) -> config.Config:
    """The service's `veil serve` command parsed and validated as the container would, its files
    read from where the compose file mounts them from."""
    args = build_parser().parse_args(service["command"])
    assert isinstance(args, argparse.Namespace) and args.command == "serve"
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = os.path.normpath(os.path.join(os.path.dirname(COMPOSE), source))
    for name, value in vars(args).items():
        if isinstance(value, str) and value in mounts:
            setattr(args, name, mounts[value])
    return config.load(args, {})


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def test_docker_compose_accepts_the_file():
    compose = compose_command()
    if compose is None:
        missing("docker compose is not installed (Debian: apt-get install docker-compose)", "VEIL_REQUIRE_COMPOSE")
    result = subprocess.run([*compose, "-f", COMPOSE, "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_veil_service_runs_a_valid_command(services):
    roles = {}
    for name, service in services.items():
        if service.get("image") == "veil" and "entrypoint" not in service:
            assert os.path.isfile(os.path.join(os.path.dirname(COMPOSE), service["build"], "Dockerfile"))
            roles[name] = veil_config(service).role
    assert sorted(roles.values()) == ["gateway", "gateway", "pipeline"]


def test_addresses_agree(services):
    master = services["spark-master"]
    assert master["entrypoint"] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    port = master["command"][master["command"].index("--port") + 1]
    master_url = f"spark://spark-master:{port}"
    workers = [s for s in services.values() if s.get("entrypoint", [None, None])[1:] == ["org.apache.spark.deploy.worker.Worker"]]
    assert len(workers) == 2 and all(worker["command"][0] == master_url for worker in workers)

    database = services["postgres"]["environment"]
    configs = {name: veil_config(s) for name, s in services.items() if s.get("image") == "veil" and "entrypoint" not in s}
    for name, cfg in configs.items():
        url = urllib.parse.urlsplit(cfg.store_url)
        assert (url.scheme, url.hostname, url.username, url.password, url.path) == (
            "postgresql", "postgres", database["POSTGRES_USER"], database["POSTGRES_PASSWORD"], "/" + database["POSTGRES_DB"]
        ), name
        if cfg.role == "pipeline":
            assert cfg.master == master_url
            assert cfg.spark_settings["spark.driver.host"] == name  # executors reach the driver by its service name
        else:
            published = {int(mapping.split(":")[1]) for mapping in services[name]["ports"]}
            assert published == {cfg.port, cfg.tcp, cfg.ws}, name
    gateways = [cfg.gateway_name for cfg in configs.values() if cfg.role == "gateway"]
    assert len(set(gateways)) == len(gateways)
