"""Open delivery connections end when the credentials that opened them stop proving their client.

A handshake is authenticated once; without this, revoking a leaked static hash (through any gateway)
or listing a certificate in the CRL would refuse new connections only, while a connection opened
with the credential went on receiving its client's deliveries. Every CHECK_INTERVAL the gateway
authenticates each open connection's credentials again against the newest registry and CRL: one
that no longer proves the identity it proved at the handshake ends with the error line saying why.
A token's own expiry ends its connection at that moment (`connection._end_at_expiry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import NamedTuple

from veil.gateway.channel import Close
from veil.gateway.registry import CurrentRegistry
from veil.protocol import ProtocolError
from veil.security.identity import Authenticator, Credentials
from veil.store import StoreUnavailable

log = logging.getLogger("veil.gateway")
CHECK_INTERVAL = 1.0  # seconds between checks of every open connection's credentials


class _Opened(NamedTuple):
    credentials: Credentials
    identity: str
    close: Close


class CredentialWatch:
    def __init__(self) -> None:
        self._open: dict[int, _Opened] = {}
        self._keys = itertools.count()
        self._ending: set[asyncio.Task[None]] = set()

    def watch(self, credentials: Credentials, identity: str, close: Close) -> int:
        """Watch a connection opened with `credentials` for `identity`; the key to forget it by."""
        key = next(self._keys)
        self._open[key] = _Opened(credentials, identity, close)
        return key

    def forget(self, key: int) -> None:
        self._open.pop(key, None)

    def check(self, auth: Authenticator) -> int:
        """End the connections whose credentials no longer prove their identity; how many ended."""
        ended = 0
        for key, opened in list(self._open.items()):
            try:
                identity = auth.principal(opened.credentials).identity
            except ProtocolError as exc:
                error = exc
            else:
                if identity == opened.identity:
                    continue
                error = ProtocolError("credentials", "no longer prove the client this connection was opened for", 401)
            del self._open[key]
            ended += 1
            task = asyncio.create_task(opened.close(error.to_json()))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        return ended

    async def follow(self, registry: CurrentRegistry, auth: Authenticator) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            if not self._open:
                continue
            try:
                with contextlib.suppress(StoreUnavailable):  # the registry in force is checked meanwhile
                    await registry.fresh()
                ended = self.check(auth)
            except Exception:  # looked at again next time; the loop must outlive any one failure
                log.exception("checking open connections' credentials failed")
                continue
            if ended:
                log.info("ended %d delivery connections whose credentials were revoked", ended)
