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


# the request field that carries the id a refusal is about, and what is said of an id nobody holds
ID_FIELDS = {"subscription": "subscriptionId", "announcement": "announcementId", "publication": "id"}
UNKNOWN = {
    "subscription": "unknown subscription",
    "announcement": "unknown announcement",
    "publication": "no publication with this id is still valid",
}


def unknown(what: str) -> ProtocolError:
    """The one answer for an id nobody holds and one someone else holds (`what`: "subscription", ...):
    a new error each time, since raising one shared error would chain every raise's frames onto it."""
    return ProtocolError(ID_FIELDS[what], UNKNOWN[what], 404)
