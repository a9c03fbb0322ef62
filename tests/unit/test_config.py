import argparse
import logging

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
    assert cfg.master == "local[3,4]"
    cfg = config.load(parse(["--port", "32000", "--tcp-port", "1234"]), env)
    assert (cfg.port, cfg.tcp) == (32000, 1234)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bind", "0.0.0.0"], "--bind"),
        (["--port", "70000"], "--port"),
        (["--port", "abc"], "--port"),
        (["--certificate", "/nonexistent.pem", "--private-key", "/nonexistent.pem"], "--certificate"),
        (["--instances", "2", "--instance-id", "1"], "--role gateway"),
        (["--role", "matcher"], "--role"),
        (["--spark-master", "spark://10.0.0.1:7077"], "--store postgresql://"),
        (["--spark-conf", "executor.memory=2g"], "--spark-conf"),
        (["--spark-conf", "spark.executor.memory"], "--spark-conf"),
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


def test_spark_settings_pass_through_from_flags_file_and_environment(tmp_path):
    flags = ["--spark-conf", "spark.executor.memory=2g", "--spark-conf", "spark.executor.extraJavaOptions=-Da=b -Dc=d"]
    cfg = config.load(parse(flags), {})
    assert cfg.spark_settings == {"spark.executor.memory": "2g", "spark.executor.extraJavaOptions": "-Da=b -Dc=d"}
    path = tmp_path / "veil.toml"
    path.write_text('spark-conf = ["spark.dynamicAllocation.enabled=true"]\nstore = "postgresql://db/veil"\n')
    cfg = config.load(parse(["--config", str(path), "--spark-master", "spark://10.0.0.1:7077"]), {})
    assert cfg.spark_settings == {"spark.dynamicAllocation.enabled": "true"}
    cfg = config.load(parse([]), {"VEIL_SPARK_CONF": "spark.a.b=1\nspark.c=2\n"})
    assert cfg.spark_settings == {"spark.a.b": "1", "spark.c": "2"}
    assert cfg.checkpoint_location.endswith("veil-data/checkpoint")


def test_a_cluster_master_with_the_sqlite_store_is_refused_before_anything_starts(tmp_path):
    """Executors on other machines could not see the file: nothing may be acknowledged that the
    pipeline could never deliver, so the broker does not start at all."""
    import subprocess
    import sys

    data = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "-m", "veil.cli", "serve", "--data-dir", str(data), "--spark-master", "spark://127.0.0.1:7077"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--spark-master spark://127.0.0.1:7077" in result.stderr and "--store postgresql://" in result.stderr
    assert not data.exists()


def test_on_off_options_are_switches_and_still_take_a_value():
    assert config.load(parse(["--anonymous"]), {}).anonymous is True
    assert config.load(parse(["--anonymous", "false"]), {}).anonymous is False
    assert config.load(parse(["--allow-plain-remote=true", "--bind", "0.0.0.0"]), {}).allow_plain_remote is True
    assert config.load(parse(["--no-with-authorization"]), {}).with_authorization is False
    assert config.load(parse([]), {"WITH_AUTHORIZATION": "false"}).with_authorization is False  # SELIS's name
    with pytest.raises(SystemExit):
        parse(["--no-anonymous", "true"])


def test_the_development_profile_in_one_flag_and_what_is_given_explicitly_wins():
    dev = config.load(parse(["--dev"]), {})
    assert (dev.auth, dev.anonymous, dev.with_authorization) == ("certificate,token,any-hash", True, False)
    assert config.load(parse(["--dev", "--no-anonymous"]), {}).anonymous is False
    assert config.load(parse([]), {"VEIL_DEV": "1", "VEIL_AUTH": "hash"}).auth == "hash"
    assert config.load(parse([]), {}).auth == "certificate,token,hash"


def test_help_shows_every_default():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    text = parser.format_help()
    assert "(default: 20000; environment VEIL_PORT, PORT)" in " ".join(text.split())
    assert "--no-with-authorization" in text and "(default: true;" in text


def test_dev_binds_loopback_whatever_bind_says_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, "veil.config"):
        dev = config.load(parse(["--dev", "--bind", "0.0.0.0", "--allow-plain-remote"]), {})
    assert dev.bind == "127.0.0.1" and "--bind 0.0.0.0" in caplog.text
    assert config.load(parse([]), {"VEIL_DEV": "1", "VEIL_BIND": "192.0.2.7"}).bind == "127.0.0.1"
    assert config.load(parse(["--dev", "--bind", "::1"]), {}).bind == "::1"


def test_a_crl_needs_the_client_ca_it_is_checked_against(tmp_path):
    crl = tmp_path / "crl.pem"
    crl.write_bytes(b"")
    with pytest.raises(ValueError, match="--crl needs --client-ca"):
        config.load(parse(["--crl", str(crl)]), {})
