"""README.md's code blocks, each with the mark that says what its test does with it.

A mark is an HTML comment on the line before a block (invisible where the Markdown is rendered):
`<!-- readme-test: KIND [NAME] [option=value ...] -->`. Kinds:

- `serve`: a command that starts a broker: the walk stops the broker it started before (Ctrl-C,
  which must leave no traceback), starts this one and waits until it is ready;
- `run`: shell commands, run in order in one bash (`set -e`); a command sent to the background (`&`)
  is given `wait=` seconds (the walk's) before the next line, and the block's background jobs must
  end by themselves. `expect='TEXT'` (repeatable) must be in what the block printed on stdout,
  `expect-stderr='TEXT'` on stderr, `once='TEXT'` exactly once in either, `lines=N`: stdout has
  exactly N lines; an `expect` given n times must be printed at least n times; `until=SECONDS` sends Ctrl-C after that long instead (a command
  that runs until stopped), which must end it cleanly;
- `file NAME`: the block is a file the next blocks use, written as NAME;
- `javascript`: the JavaScript client's example, run by `tests/integration/test_js_client.py`
  against its broker (the address in it replaced by that broker's);
- `shell`, `yaml`, `python`, `toml [PATH]`: checked for syntax only (commands that need more than one
  machine or minutes, a configuration shown in part); a `toml` block with a PATH must equal that file;
- `output`: text, a table or a layout; not checked.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARK = re.compile(r"^\s*<!-- readme-test: (.*?) -->\s*$")
KINDS = {"serve", "run", "file", "shell", "yaml", "python", "toml", "output", "javascript"}
FENCE = re.compile(r"^\s*(```|~~~)")
OPTIONS = {"expect", "expect-stderr", "once", "lines", "until"}


@dataclass
class Block:
    line: int  # 1-based, the block's first line in README.md
    kind: str
    text: str
    name: str | None = None
    options: dict[str, list[str]] = field(default_factory=dict)

    def option(self, name: str) -> list[str]:
        return self.options.get(name, [])


def _indented(lines: list[str], start: int) -> tuple[int, list[str]]:
    """The indented block starting at `start`: its lines (blank ones inside it kept) and where it ends."""
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = start
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) >= depth):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return end, lines[start:end]


def _block_at(lines: list[str], start: int) -> tuple[int, list[str]] | None:
    """The code block that starts at line `start` (fenced, or indented by 4 or more after a blank line
    or a mark), if one does."""
    if FENCE.match(lines[start]):
        end = start + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"README.md:{start + 1}: a fenced block that never closes")
        return end + 1, lines[start + 1 : end]
    after = start == 0 or not lines[start - 1].strip() or MARK.match(lines[start - 1])
    if lines[start].startswith("    ") and lines[start].strip() and after:
        return _indented(lines, start)
    return None


def blocks(text: str | None = None) -> tuple[list[Block], list[int]]:
    """The README's marked blocks in order, and the lines of blocks without a mark."""
    lines = (README.read_text() if text is None else text).splitlines()
    found: list[Block] = []
    unmarked: list[int] = []
    mark: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        marked = MARK.match(lines[i])
        if marked:
            if mark is not None:
                raise ValueError(f"README.md:{i + 1}: a second mark before the block of line {mark[0]}'s")
            mark = (i + 1, marked.group(1))
            i += 1
            continue
        block = _block_at(lines, i)
        if block is None:
            if lines[i].strip():
                mark = None  # a mark belongs to the block right after it
            i += 1
            continue
        end, body = block
        if mark is None:
            unmarked.append(i + 1)
        else:
            found.append(_parse(mark[1], i + 1, textwrap.dedent("\n".join(body)) + "\n"))
            mark = None
        i = end
    return found, unmarked


def _parse(mark: str, line: int, text: str) -> Block:
    words = shlex.split(mark)
    kind, rest = words[0], words[1:]
    if kind not in KINDS:
        raise ValueError(f"README.md:{line}: unknown readme-test kind {kind!r}")
    name = rest.pop(0) if rest and "=" not in rest[0] else None
    options: dict[str, list[str]] = {}
    for word in rest:
        key, _, value = word.partition("=")
        if key not in OPTIONS:
            raise ValueError(f"README.md:{line}: unknown readme-test option {key!r} (one of {sorted(OPTIONS)})")
        options.setdefault(key, []).append(value)
    return Block(line, kind, text, name, options)
