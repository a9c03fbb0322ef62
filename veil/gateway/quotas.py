"""What each client (an authenticated identity) may hold of the gateway: delivery connections, and
bytes of delivery lines queued in memory for them; and what all of them together may queue.

A connection whose client (or the gateway) has no room left queues nothing more in memory: its
subscriptions read what they are owed from the store once the connection takes lines again, so a
client that reads slowly or not at all costs its own quota and store space, and nobody else's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from veil.protocol import ProtocolError

UNLIMITED = 1 << 62
# seconds a write may wait for its client before the client counts as not reading: a client that
# reads takes a 64 KiB write in milliseconds, even from a gateway short of CPU
STALLED_WRITE = 0.25


class WriteWatch:
    """Whether a connection's client reads what it is sent. A client is not reading while a write has
    waited for it longer than STALLED_WRITE, and stays so once a write took that long, until a write
    goes through in less: the kernel's buffers take a little now and then even from a client that
    never reads, and between two such writes (while the next lines are read from the store) it would
    otherwise count as a client that reads."""

    __slots__ = ("since", "slow")

    def __init__(self) -> None:
        self.since: float | None = None  # when the write under way began
        self.slow = False  # the last write waited longer than STALLED_WRITE

    def not_reading(self, now: float) -> bool:
        return self.slow or (self.since is not None and now - self.since > STALLED_WRITE)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self.since = time.monotonic()
        try:
            yield
            self.slow = time.monotonic() - self.since > STALLED_WRITE
        finally:
            self.since = None


@dataclass
class Client:
    """One identity's share: its open delivery connections and the bytes queued for them."""

    identity: str
    connections: int = 0
    webhooks: int = 0  # webhook subscriptions the gateway delivers for it: no connections of its own
    queued: int = 0


class Quotas:
    def __init__(self, max_connections: int, max_client_queued: int, max_queued: int) -> None:
        self.max_connections = max_connections
        self.max_client_queued = max_client_queued
        self.max_queued = max_queued
        self.queued = 0  # bytes, all clients together
        self._clients: dict[str, Client] = {}

    def connect(self, identity: str, webhook: bool = False) -> Client:
        """One more delivery connection of this client; ProtocolError (429) past its limit. A webhook
        subscription's delivery takes a place beside them, never one of them."""
        client = self._clients.setdefault(identity, Client(identity))
        if webhook:
            client.webhooks += 1
            return client
        if client.connections >= self.max_connections:
            raise ProtocolError(
                "handshake",
                f"this client has {client.connections} delivery connections open, the most one client may "
                "(--max-client-connections); close one first",
                429,
            )
        client.connections += 1
        return client

    def disconnect(self, client: Client) -> None:
        """A connection of `client` closed (having released what it queued)."""
        client.connections -= 1
        self._forget_idle(client)

    def disconnect_webhook(self, client: Client) -> None:
        """A webhook subscription's delivery for `client` ended (having released what it queued)."""
        client.webhooks -= 1
        self._forget_idle(client)

    def _forget_idle(self, client: Client) -> None:
        if client.connections <= 0 and client.webhooks <= 0 and client.queued <= 0:
            self._clients.pop(client.identity, None)

    def room(self, client: Client) -> int:
        """Bytes `client` may queue now."""
        return min(self.max_client_queued - client.queued, self.max_queued - self.queued)

    def take(self, client: Client, size: int) -> None:
        client.queued += size
        self.queued += size

    def release(self, client: Client, size: int) -> None:
        client.queued -= size
        self.queued -= size


def fitting(sizes: np.ndarray, room: int, least: int) -> int:
    """How many of the leading items of these sizes fit in `room` bytes, and at least `least` of them
    (a connection with nothing queued still takes one line, however large, so that it makes progress)."""
    return max(int(np.searchsorted(np.cumsum(sizes), room, side="right")), min(least, len(sizes)))
