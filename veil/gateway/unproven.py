"""A bound on connections that are not doing anything yet: those that have not sent a request or a
delivery handshake, and HTTP keep-alive connections between requests.

Such connections cost a descriptor and a buffer each and prove nothing, so a client that opens
thousands and sends half a request on each could otherwise take every descriptor the gateway has.
A new connection must complete its first request (or handshake) within the read timeout; and past
the limit, the connection that has waited longest is closed, since an honest client sends its
request within milliseconds of connecting and is never the oldest. A delivery connection closed
either way gets an error line saying why first (the reason `close` is given).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

Closer = Callable[[str], object]
"""Closes a connection that has yet to prove itself, given the reason (which a delivery connection
sends as an error line first)."""


class Unproven:
    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self._waiting: OrderedDict[object, tuple[Closer, asyncio.TimerHandle | None]] = OrderedDict()

    def watch(self, key: object, close: Closer, timed: bool = True) -> None:
        """A connection that has yet to prove itself (`timed`: closed unless it settles within the read
        timeout), or one idle between requests; `close` ends it if it has to make room."""
        self.settle(key)
        timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, key) if timed else None
        self._waiting[key] = (close, timer)
        while len(self._waiting) > self.limit:
            _, (oldest, handle) = self._waiting.popitem(last=False)
            if handle is not None:
                handle.cancel()
            oldest(f"more than {self.limit} connections had yet to send a request or handshake: the oldest went")

    def settle(self, key: object) -> None:
        """The connection sent a request or a handshake (or went away)."""
        entry = self._waiting.pop(key, None)
        if entry is not None and entry[1] is not None:
            entry[1].cancel()

    def _expire(self, key: object) -> None:
        entry = self._waiting.pop(key, None)
        if entry is not None:
            entry[0](f"no request or handshake within {self.timeout:g} s")

    def tracking(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory whose connections are admitted when made and settled when lost; the
        HTTP server settles them while a request is being handled."""

        def make() -> asyncio.Protocol:
            return _Tracked(factory(), self)

        return make


class _Tracked(asyncio.Protocol):
    """Forwards every protocol event to the HTTP server's own protocol object."""

    def __init__(self, inner: asyncio.Protocol, unproven: Unproven) -> None:
        self.inner = inner
        self.unproven = unproven

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.unproven.watch(self.inner, lambda _: transport.close())
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.unproven.settle(self.inner)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
