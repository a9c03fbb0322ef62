"""The command line's own parts: standard input for `veil edge`, and arguments refused by name."""

from __future__ import annotations

import io
import sys

import pytest

from veil import cli


async def read_all(monkeypatch, raw: bytes) -> list[str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="strict"))
    return [line async for line in cli._stdin_lines()]


async def test_standard_input_comes_line_by_line_and_a_bad_read_is_raised(monkeypatch):
    assert await read_all(monkeypatch, b'{"a": 1}\n\n{"a": 2}') == ['{"a": 1}\n', "\n", '{"a": 2}']
    with pytest.raises(ValueError, match="standard input"):
        await read_all(monkeypatch, b'{"a": 1}\n\xff\n')  # not UTF-8: an error, not a hang


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["subscribe", "--id", "", "a>1"], "--id"),
        (["subscribe", "--count", "0", "a>1"], "--count"),
        (["subscriptions", "remove"], "give the ids"),
        (["subscriptions", "show", "--all"], "--all"),
        (["subscriptions", "remove", "x", "--all"], "--all"),
        (["subscriptions", "x"], "invalid choice"),
    ],
)
def test_arguments_that_cannot_work_are_refused_naming_the_option(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_a_token_lives_at_most_a_year(tmp_path):
    for ttl in ("inf", "nan", "0", str(367 * 86400)):
        with pytest.raises(SystemExit, match="--ttl"):
            cli.main(["token", "--dir", str(tmp_path), "--subject", "bob", "--ttl", ttl])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give --topic"),
        (["--topic", "a/{x}"], "--topic needs a credential"),
        (["--auth-hash", "b", "--topic", "a/{x:date}"], "--topic: topic template 'a/{x:date}'"),
        (["--auth-hash", "b", "--topic", "a/b#"], "--topic: topic template 'a/b#'"),
        (["--deliver", "s=alerts/#"], "--deliver: topic template 'alerts/#': a topic to publish to holds no"),
        (["--deliver", "alerts"], "--deliver: 'alerts': write SUBSCRIPTION_ID=TOPIC"),
        (["--auth-hash", "b", "--topic", "a", "--mqtt", "http://x"], "--mqtt 'http://x'"),
        (["--auth-hash", "b", "--topic", "a", "--mqtt", "mqtt://x:99999"], "the port"),
    ],
)
def test_bridge_arguments_that_cannot_work_are_refused_naming_the_option(argv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for variable in ("VEIL_AUTH_HASH", "VEIL_TOKEN", "VEIL_MQTT"):
        monkeypatch.delenv(variable, raising=False)
    assert cli.main(["bridge", "mqtt", *argv]) == 2
    assert says in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything was made
