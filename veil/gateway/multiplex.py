"""Multiplexed delivery connections: one connection carries many subscriptions of one client.

Each subscription keeps a session of its own (queue, cursor, backlog, claim), so a multiplexed
subscription behaves as it would alone; only writing is shared. What the sessions send in the same
turn of the event loop (the hub offers a feed entry to all of them at once) goes out as one write in
which each publication appears once, enveloped, with the ids of the subscriptions it is delivered
to: a reading that matches a quarter of 20,000 subscriptions held by a few client processes costs a
few lines, not 5,000. Sessions reading their backlogs (after a reconnect, or behind) send at their
own pace, so there a publication may come once per subscription. Per subscription the order stays
the order of its queue, since every write is sorted by sequence number and writes leave one at a time.

A subscription that ends (unsubscribed, quarantined, replaced by a newer connection) ends alone: its
error line names it (`subscriptionId`) and the connection goes on for the others until none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import orjson

from veil.gateway import membership
from veil.gateway.channel import Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.gateway.delivery import Session
from veil.protocol import Handshake, ProtocolError, parse_ack
from veil.protocol.envelope import wrap


class Mux:
    """The connection's one writer for its sessions' deliveries."""

    def __init__(self, send: Send) -> None:
        self._send = send
        # (seq, envelope fields, body) -> ids of the subscriptions it goes to, in this write
        self._pending: dict[tuple[int, bytes, bytes], list[str]] = {}
        self._written: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None

    async def send(self, sub_id: str, pubs: list[int], bodies: list[bytes], envelopes: list[bytes]) -> None:
        """Queue one session's deliveries for the next write and wait until it was written."""
        for delivery in zip(pubs, envelopes, bodies, strict=True):
            self._pending.setdefault(delivery, []).append(sub_id)
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        written = self._written
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(written)

    async def ended(self, sub_id: str, error: bytes | None) -> None:
        """A session's close: its error line, naming it; the connection stays."""
        if error is not None:
            with contextlib.suppress(Exception):
                await self._send([error[:-1] + b',"subscriptionId":' + orjson.dumps(sub_id) + b"}"])

    async def _write(self) -> None:
        await asyncio.sleep(0)  # the other sessions woken by the same feed entry add theirs first
        while self._pending:
            pending, self._pending = self._pending, {}
            written, self._written = self._written, None
            assert written is not None
            frames = [
                wrap(seq, body, (members + b"," if members else b"") + b'"subscriptionIds":' + orjson.dumps(ids))
                for (seq, members, body), ids in sorted(pending.items(), key=lambda item: item[0][0])
            ]
            try:
                await self._send(frames)
            except Exception as exc:  # every session waiting on this write learns it
                written.set_exception(exc)
                written.exception()  # retrieved: sessions already gone must not make it "never retrieved"
                return
            written.set_result(None)


async def serve_multiplexed(
    gateway: Gateway, handshake: Handshake, identity: str | None, send: Send, close: Close, receive: Receive
) -> None:
    """Serve a connection that named several subscriptions, until the client leaves or none is left."""
    from veil.gateway.connection import open_session  # (imported here: connection dispatches to this module)

    mux = Mux(send)
    sessions: list[Session] = []
    try:
        for sub_id in handshake.subscription_ids:
            try:
                sessions.append(
                    await open_session(
                        gateway, handshake._replace(subscription_id=sub_id), identity, send,
                        lambda error, sub_id=sub_id: mux.ended(sub_id, error), mux,
                    )
                )  # fmt: skip
            except ProtocolError as exc:
                raise ProtocolError("subscriptionIds", f"{sub_id}: {exc.problem}", exc.status) from None
    except ProtocolError as exc:
        await _end(gateway, sessions)
        await close(exc.to_json())
        return
    pushers = [asyncio.create_task(session.run()) for session in sessions]
    all_ended = asyncio.ensure_future(asyncio.gather(*pushers, return_exceptions=True))

    def acknowledge(raw: bytes | str) -> None:
        if raw.strip():
            with contextlib.suppress(ProtocolError):
                seq = parse_ack(raw)
                for session in sessions:
                    session.acknowledge(seq)

    try:
        await read_while(all_ended, receive, acknowledge)  # type: ignore[arg-type]
    finally:
        await _end(gateway, sessions)
        for pusher in pushers:
            pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
            await all_ended
        await close(None)


async def _end(gateway: Gateway, sessions: list[Session]) -> None:
    for session in sessions:
        session.closed = True
        gateway.hub.detach(session)
        with contextlib.suppress(Exception):  # a claim not released lapses with this gateway's renewals
            await membership.release(gateway, session.sub_id, session.claimed)
