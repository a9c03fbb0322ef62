"""MQTT topic templates: `sensors/{site}/{floor:int}/#` names the attributes a topic's levels give a
publication on the way in, and the topic a delivery is published under on the way out.

A level is a literal, `+` (any one level, not kept), `{name}` (one level, kept as a string) or
`{name:int}` / `{name:float}` (one level, kept as that number: a subscription `floor = 3` compares
numbers), and the last level may be `#` (any rest). Topics are text a device chose: a level that
does not parse as the number its template asks for makes the message unusable (`TopicMismatch`),
never a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_.-]*)(?::(str|int|float))?\}$")
# what a value may not carry into a topic level of its own: the escape, the separator, the wildcards,
# and what MQTT forbids or brokers refuse in a topic (NUL, control characters, non-characters, lone
# surrogates): each is percent-encoded, as are a first level's leading `$` (the brokers' own topics)
_NONCHARACTERS = "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
UNSAFE = re.compile(f"[%/+#\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff\\ufdd0-\\ufdef{_NONCHARACTERS}]")
NUMBER = {
    "int": re.compile(r"-?[0-9]+"),
    "float": re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"),
}  # ASCII only: `٣`, `+3`, ` 3` and `3_0` are not numbers a topic level gives
CONVERT: dict[str, type] = {"str": str, "int": int, "float": float}
MAX_TOPIC = 65535  # bytes of UTF-8, MQTT's limit


class TopicMismatch(ValueError):
    """A topic whose levels do not give what its template asks for."""


@dataclass(frozen=True)
class TopicTemplate:
    text: str
    levels: tuple[tuple[str, str | None, str], ...]  # (literal or "", attribute or None, type)
    rest: bool  # ends in `#`

    @classmethod
    def parse(cls, text: str) -> TopicTemplate:
        """The template, or ValueError naming what is wrong with it."""
        if not text or "\x00" in text:
            raise ValueError(f"topic template {text!r}: empty, or holds NUL")
        parts = text.split("/")
        rest = parts[-1] == "#"
        if rest:
            parts = parts[:-1]
        levels: list[tuple[str, str | None, str]] = []
        names: set[str] = set()
        for part in parts:
            found = PLACEHOLDER.match(part)
            if found:
                name, kind = found.group(1), found.group(2) or "str"
                if name in names:
                    raise ValueError(f"topic template {text!r}: {{{name}}} twice")
                names.add(name)
                levels.append(("", name, kind))
            elif part == "+":
                levels.append(("+", None, "str"))
            elif "#" in part or "+" in part or "{" in part or "}" in part:
                raise ValueError(
                    f"topic template {text!r}: level {part!r} is neither a literal, +, # (last), nor {{name}} / "
                    "{name:int} / {name:float}"
                )
            else:
                levels.append((part, None, "str"))
        return cls(text, tuple(levels), rest)

    @property
    def filter(self) -> str:
        """The MQTT topic filter that receives what this template reads."""
        levels = ["+" if name is not None else literal for literal, name, _ in self.levels]
        return "/".join([*levels, "#"] if self.rest else levels)

    def attributes(self, topic: str) -> dict[str, Any]:
        """The attributes `topic`'s levels give, or TopicMismatch."""
        parts = topic.split("/")
        if len(parts) < len(self.levels) or (len(parts) > len(self.levels) and not self.rest):
            raise TopicMismatch(f"topic {shown(topic)} does not fit {self.text!r}")
        found: dict[str, Any] = {}
        for part, (literal, name, kind) in zip(parts, self.levels, strict=False):
            if name is None:
                if literal != "+" and part != literal:
                    raise TopicMismatch(f"topic {shown(topic)} does not fit {self.text!r}")
                continue
            pattern = NUMBER.get(kind)
            if pattern is not None and not pattern.fullmatch(part):
                raise TopicMismatch(f"topic {shown(topic)}: level {shown(part)} is not the {kind} {{{name}}} asks for")
            try:
                value = CONVERT[kind](part)
            except ValueError:  # digits beyond what int() takes
                raise TopicMismatch(f"topic {shown(topic)}: level {shown(part)} is too long a number") from None
            if isinstance(value, float) and not math.isfinite(value):
                raise TopicMismatch(f"topic {shown(topic)}: level {shown(part)} is not a finite number")
            found[name] = value
        return found

    def render(self, publication: dict[str, Any]) -> str:
        """The topic a delivery of `publication` goes to: each {name} is its top-level attribute of that
        name, percent-encoded where it holds what would leave its level or that MQTT forbids (`UNSAFE`),
        so that a publisher cannot steer it into another branch of the tree or break the connection;
        a missing or non-scalar one is an empty level. TopicMismatch when the topic would be empty or
        longer than MQTT allows. Templates for the way out end in no wildcard (`check_outbound`)."""
        levels = []
        for literal, name, _ in self.levels:
            if name is None:
                levels.append(literal)
                continue
            value = publication.get(name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str | int | float):
                text = str(value)
            else:
                text = ""
            levels.append(UNSAFE.sub(_percent, text))
        topic = "/".join(levels)
        if topic.startswith("$") and self.levels[0][1] is not None:
            topic = "%24" + topic[1:]
        if not topic or len(topic.encode()) > MAX_TOPIC:
            raise TopicMismatch(f"template {self.text!r}: the topic would be empty or longer than {MAX_TOPIC} bytes")
        return topic

    def check_outbound(self) -> TopicTemplate:
        """This template, if deliveries can be published under it (no `+` or `#`)."""
        if self.rest or any(literal == "+" for literal, _, _ in self.levels):
            raise ValueError(f"topic template {self.text!r}: a topic to publish to holds no + or #")
        return self


def _percent(found: re.Match[str]) -> str:
    return "".join(f"%{byte:02X}" for byte in found.group().encode(errors="surrogatepass"))


def shown(text: str) -> str:
    """A device's text (a topic, a level) for a message or a log: up to 64 KB of it."""
    return repr(text if len(text) <= 120 else text[:120] + "…")
