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

