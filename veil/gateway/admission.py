"""A cap on connections that have not yet sent a request or a delivery handshake.

Such connections cost a descriptor and a buffer each and prove nothing, so a client that opens
thousands and sends half a request on each could otherwise take every descriptor the gateway has.
Each listener times out its own silent connections (the HTTP keep-alive timer, the handshake
timeout); this keeps their number bounded in between: past the limit, the connection that has
waited longest is closed, since an honest client sends its request within milliseconds of
connecting and is never the oldest.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._waiting: OrderedDict[object, Callable[[], object]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def admit(self, key: object, close: Callable[[], object]) -> None:
        """A connection that has yet to prove itself; `close` ends it if it has to make room."""
        self._waiting[key] = close
        while len(self._waiting) > self.limit:
            _, oldest = self._waiting.popitem(last=False)
            self.evicted += 1
            oldest()

    def settle(self, key: object) -> None:
        """The connection sent a request or a handshake (or went away)."""
        self._waiting.pop(key, None)

    def tracking(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory whose connections are admitted when made and settled when lost; the
        server settles them earlier, when their first request arrives."""

        def make() -> asyncio.Protocol:
            return _Tracked(factory(), self)

        return make


class _Tracked(asyncio.Protocol):
    """Forwards every protocol event to the HTTP server's own protocol object."""

    def __init__(self, inner: asyncio.Protocol, admission: Admission) -> None:
        self.inner = inner
        self.admission = admission

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.admission.admit(self.inner, transport.close)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.settle(self.inner)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
