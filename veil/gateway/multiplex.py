"""Multiplexed delivery connections: one connection carries many subscriptions of one client, each
admitted as it would be alone, delivered as one `Bundle`; the client's acknowledgements go to it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from veil.gateway import membership, memory
from veil.gateway.bundle import Bundle
from veil.gateway.channel import Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.gateway.subscriber import Admitted, admit
from veil.protocol import Handshake, ProtocolError, parse_ack
from veil.security.identity import Principal


async def serve_multiplexed(
    gateway: Gateway, handshake: Handshake, principal: Principal, send: Send, close: Close, receive: Receive
) -> None:
    """Serve a connection that named several subscriptions, until the client leaves or none is left."""
    admitted: list[Admitted] = []
    try:
        for place, sub_id in enumerate(handshake.subscription_ids):
            try:
                admitted.append(await admit(gateway, handshake.for_subscription(place), principal))
            except ProtocolError as exc:
                raise ProtocolError("subscriptionIds", f"{sub_id}: {exc.problem}", exc.status) from None
        client = gateway.hub.quotas.connect(admitted[0].client)
    except ProtocolError as exc:
        await _release(gateway, admitted)
        await close(exc.to_json())
        return
    bundle = Bundle(gateway.hub, handshake, admitted, send, close, client)
    await gateway.hub.attach_bundle(bundle)
    threads = gateway.threads
    # an unsubscription that ran before the attach found nothing to end (the id may be taken again since)
    for sub_id, number in zip(bundle.ids, bundle.numbers.tolist(), strict=True):
        if await threads.read(threads.store.subscription_number, sub_id) != number:
            await bundle.end(sub_id, ProtocolError("subscriptionId", "unknown subscription", 404).to_json())
    pusher = asyncio.create_task(bundle.run())

    def acknowledge(raw: bytes | str) -> None:
        if raw.strip():
            with contextlib.suppress(ProtocolError):
                bundle.acknowledge(parse_ack(raw))

    try:
        await read_while(pusher, receive, acknowledge)
    finally:
        gateway.hub.detach_bundle(bundle)
        pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
            await pusher
        bundle.forget()
        gateway.hub.quotas.disconnect(client)
        memory.give_back()
        await _release(gateway, admitted)  # (a claim taken since by a newer connection is not this one's)
        await bundle.close()


async def _release(gateway: Gateway, admitted: list[Admitted]) -> None:
    for a in admitted:
        with contextlib.suppress(Exception):  # a claim not released lapses with this gateway's renewals
            await membership.release(gateway, a.sub_id, a.claimed)
