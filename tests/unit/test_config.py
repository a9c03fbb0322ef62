import argparse

import pytest

from veil import config


def parse(argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_precedence_flags_over_environment_over_file(tmp_path):
    path = tmp_path / "veil.toml"
    path.write_text('port = 30000\nhostname = "file-host"\nworkers = 3\n')
    env = {"PORT": "31000", "VEIL_CONFIG": str(path)}
    cfg = config.load(parse([]), env)
    assert (cfg.port, cfg.hostname, cfg.workers, cfg.tcp, cfg.ws) == (31000, "file-host", 3, 31001, 31002)
    assert cfg.master == "local[3]"
    cfg = config.load(parse(["--port", "32000", "--tcp-port", "1234"]), env)
    assert (cfg.port, cfg.tcp) == (32000, 1234)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bind", "0.0.0.0"], "--bind"),
        (["--port", "70000"], "--port"),
        (["--port", "abc"], "--port"),
        (["--certificate", "/nonexistent.pem", "--private-key", "/nonexistent.pem"], "--certificate"),
        (["--instances", "2", "--instance-id", "2"], "--instance-id"),
        (["--with-authorization", "maybe"], "--with-authorization"),
        (["--metrics-interval", "0.5"], "--metrics-interval"),
    ],
)
def test_bad_settings_name_the_option(argv, message):
    with pytest.raises(ValueError, match=message):
        config.load(parse(argv), {})


def test_unknown_file_option(tmp_path):
    path = tmp_path / "veil.toml"
    path.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="prot"):
        config.load(parse(["--config", str(path)]), {})
