"""The errors a client meets, one class per kind of answer, so that an application catches what it
can handle (`except Overloaded: retry later`) rather than comparing status codes. They are the
protocol's errors (`ProtocolError`: field, problem, status) as a client receives them."""

from __future__ import annotations

import orjson

from veil.protocol import ProtocolError


class VeilError(ProtocolError):
    """Anything the broker refused, or a delivery the client could not accept."""

    def __str__(self) -> str:
        return f"{self.status} {self.field}: {self.problem}" if self.field else f"{self.status} {self.problem}"


class BadRequest(VeilError):
    """400: the request or handshake is malformed; `field` says where."""


class Unauthorized(VeilError):
    """401: no proof of identity the broker accepts."""


class Forbidden(VeilError):
    """403: the id is held by another client's live subscription (subscribing under it), or the
    client may not do this."""


class NotFound(VeilError):
    """404: no such subscription, announcement or still-valid publication (a subscription of another
    client's is answered as none: whether it exists is not told)."""


class Replaced(VeilError):
    """409: another connection took over the subscription, a scope key version is not (or no
    longer) the one to seal with, or the registry changed since the version a change was made from."""


class Gone(VeilError):
    """410: the subscription was removed or the announcement revoked."""


class Quarantined(VeilError):
    """422: the broker set the subscription aside (it could not process it)."""


class Overloaded(VeilError):
    """503: the broker cannot take this now; retry later (`retry_after`: the seconds it asked for)."""

    retry_after: float | None = None


class TamperedPublication(VeilError):
    """A delivery whose publisher signature does not verify: it is not handed to the application."""


class UntrustedKey(VeilError):
    """The broker served a scope key or roster that no manager this client pins signed for it, or an
    older version than one it has seen: nothing was sealed under it."""


class BrokerFault(VeilError):
    """The broker sent what the protocol does not allow (a line that is no envelope, a sequence
    number out of range, subscriptions the connection does not carry). The stream reconnects, backing
    off, and gives up with this error once that keeps happening."""


BY_STATUS: dict[int, type[VeilError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Replaced, 410: Gone,
    422: Quarantined, 503: Overloaded,
}  # fmt: skip
FATAL = (BadRequest, Unauthorized, Forbidden, NotFound, Replaced, Gone)  # reconnecting would only be refused again


def error_for(status: int, field: str, problem: str) -> VeilError:
    """The error of the class that the status stands for."""
    cls = BY_STATUS.get(status, VeilError)
    return cls(field, problem, status)


def error_from_document(doc: dict, status: int = 0) -> VeilError:
    """The error an error document (`{"error", "field", "status"}`) reports; members of the wrong
    type (from a broker gone wrong) count as missing."""
    code, field, problem = doc.get("status"), doc.get("field"), doc.get("error")
    return error_for(
        code if isinstance(code, int) and not isinstance(code, bool) else status,
        field if isinstance(field, str) else "",
        problem if isinstance(problem, str) else "",
    )


def error_from_body(status: int, body: bytes) -> VeilError:
    """The error an HTTP answer reports, readable or not."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        return error_from_document(doc, status)
    return error_for(status, "", body.decode(errors="replace"))
