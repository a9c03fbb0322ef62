"""The one error type of the protocol layer, carrying the HTTP status and the offending field."""

from __future__ import annotations

import orjson


class ProtocolError(Exception):
    """A client's mistake: names the field at fault so that the client can fix its request."""

    def __init__(self, field: str, problem: str, status: int = 400) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem
        self.status = status

    def to_json(self) -> bytes:
        return orjson.dumps({"error": self.problem, "field": self.field, "status": self.status})


def load_json(raw: bytes, field: str = "body") -> object:
    """Parse JSON; a syntax error becomes a 400 that says where parsing stopped."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(field, f"malformed JSON: {exc}") from None
