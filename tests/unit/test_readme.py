"""README.md's blocks are all marked, and those that cannot run are well formed; its option tables
and every command's help agree (tests/integration/test_readme.py runs the rest)."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.readme import README, ROOT, blocks
from veil import cli, config

DEFAULT = re.compile(r"(?:\(|; )default: ([^;)]*)")


def test_every_block_says_what_its_test_does_with_it():
    marked, unmarked = blocks()
    assert not unmarked, f"README.md lines {unmarked}: blocks without a readme-test mark (see tests/readme.py)"
    assert len(marked) >= 20


@pytest.mark.parametrize("block", [b for b in blocks()[0] if b.kind in ("shell", "run", "serve")], ids=str)
def test_shell_blocks_parse(block):
    checked = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert checked.returncode == 0, f"README.md:{block.line}: {checked.stderr}"


def test_yaml_python_and_toml_blocks_parse():
    for block in blocks()[0]:
        where = f"README.md:{block.line}"
        if block.kind == "yaml" or (block.kind == "file" and block.name and block.name.endswith(".yaml")):
            assert isinstance(yaml.safe_load(block.text), dict), where
        elif block.kind == "python":
            ast.parse(block.text)
        elif block.kind == "toml":
            tomllib.loads(block.text)
            if block.name:
                assert (ROOT / block.name).read_text() == block.text, f"{where}: differs from {block.name}"
                loaded = config.load(argparse.Namespace(config=str(ROOT / block.name)), {})
                assert loaded.port == 20000, where


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.option_strings[0]: action for action in parser._actions if action.option_strings}


def _commands(parser: argparse.ArgumentParser, prefix: str = "veil") -> dict[str, argparse.ArgumentParser]:
    found = {prefix: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_commands(sub, f"{prefix} {name}"))
    return found


@pytest.mark.parametrize("command", sorted(_commands(cli.build_parser())))
def test_every_option_is_listed_once_with_one_default(command):
    parser = _commands(cli.build_parser())[command]
    entries = [line.split()[0].rstrip(",") for line in parser.format_help().splitlines() if re.match(r"  -", line)]
    for flag, action in _options(parser).items():
        assert entries.count(flag) == 1, f"{command} {flag}: listed {entries.count(flag)} times"
        defaults = DEFAULT.findall(" ".join((action.help or "").split()))
        states_one = action.nargs != 0 and not action.required and flag != "-h"
        assert len(defaults) == (1 if states_one else 0), f"{command} {flag}: {len(defaults)} defaults"


def _readme_tables() -> dict[str, str]:
    """Option -> default, from the README's option tables (a parenthesis in a default is a gloss)."""
    table: dict[str, str] = {}
    for row in README.read_text().splitlines():
        if not row.startswith("| `--"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
        flags = re.findall(r"--[a-z0-9-]+", cells[0])
        shown = re.sub(r"\s*\([^)]*\)", "", cells[1]).replace("`", "")
        defaults = [d.strip() for d in re.split(r", | / ", shown)]
        if len(defaults) == 1:
            defaults *= len(flags)
        assert len(defaults) == len(flags), f"README row {row!r}: {len(flags)} options, {len(defaults)} defaults"
        for flag, default in zip(flags, defaults, strict=True):
            assert flag not in table, f"{flag} is in two README rows"
            table[flag] = default
    return table


def test_the_readme_tables_list_every_serve_option_with_its_default():
    serve = _commands(cli.build_parser())["veil serve"]
    helped = {
        flag: DEFAULT.findall(" ".join(action.help.split()))[0]
        for flag, action in _options(serve).items()
        if flag != "-h" and not flag.startswith("--no-")
    }
    assert _readme_tables() == helped


BENCHMARKS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if "__main__" in p.read_text())


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_answers_help_without_running(name):
    answered = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert answered.returncode == 0 and answered.stdout.startswith("usage:"), answered.stderr
