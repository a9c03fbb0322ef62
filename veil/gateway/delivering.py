"""Delivery connections of subscriptions: one connection carries one subscription, or many of one
client (multiplexed), each admitted as it would be alone, all delivered as one `Bundle`; the client's
acknowledgements go to it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from veil.gateway import membership
from veil.gateway.bundle import Admitted, Bundle
from veil.gateway.channel import Close, Receive, Send, failure_line, read_while
from veil.gateway.context import Gateway
from veil.gateway.quotas import Client
from veil.gateway.subscriber import admit
from veil.protocol import Handshake, ProtocolError, parse_ack
from veil.protocol.errors import unknown
from veil.security.identity import Principal


async def serve_subscriptions(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, send: Send, close: Close,
    receive: Receive, webhook: bool = False,
) -> None:  # fmt: skip
    """Serve a connection of the handshake's subscriptions, in `client`'s connection place, until the
    client leaves or none is left (`webhook`: the gateway's own delivery of a webhook subscription).
    Whatever ends it (the client, an error, the gateway stopping), its claims are given back."""
    try:
        admitted = await admit(gateway, handshake, principal, webhook)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    bundle: Bundle | None = None
    ending: bytes | None = None
    try:
        bundle = Bundle(gateway.hub, handshake, admitted, send, close, client)
        await _deliver(gateway, bundle, admitted, receive)
    except Exception as exc:
        ending = failure_line(exc, gateway.threads.store.failures)
        raise
    finally:
        if bundle is not None:  # (told first: releasing writes to a store that may be failing)
            await bundle.close(ending)
        await hand_back(gateway, [a.sub_id for a in admitted], admitted[0].claimed)


async def hand_back(gateway: Gateway, sub_ids: list[str], claimed: float) -> None:
    """The claim taken at `claimed` ends (one taken since by a newer connection is not this one's),
    once the cursors are saved: the queues' bounds apply to an unclaimed subscription after its
    saved cursor, which must not be behind what was delivered, and another gateway resumes there.
    While they cannot be saved, the claim is released with the renewals, after the cursors' retries."""
    if await gateway.hub.flush_cursors(bundles=False):
        await membership.release(gateway, sub_ids, claimed)
    else:
        gateway.unreleased.append((sub_ids, claimed))


async def attach(gateway: Gateway, bundle: Bundle, admitted: list[Admitted]) -> bool:
    """Deliver the bundle's subscriptions through it from now on; False when none is left to."""
    gateway.hub.attach(bundle)
    # an unsubscription that ran before the attach found nothing to end (the id may be taken again since)
    threads = gateway.threads
    numbers = await threads.read(threads.store.live_numbers, bundle.ids)
    gone = [a for a, now in zip(admitted, numbers, strict=True) if now != a.number]
    if gone:  # a subscription taken since under the id is its new owner's to connect anywhere
        await bundle.end([(a.sub_id, unknown("subscription").to_json()) for a in gone])
        await membership.release(gateway, [a.sub_id for a in gone], admitted[0].claimed)
    return len(gone) < len(admitted)


async def _deliver(gateway: Gateway, bundle: Bundle, admitted: list[Admitted], receive: Receive) -> None:
    hub = gateway.hub
    pusher: asyncio.Task[None] | None = None
    try:
        await attach(gateway, bundle, admitted)
        pusher = asyncio.create_task(bundle.run())

        def acknowledge(raw: bytes | str) -> None:
            """After the handshake a client may only acknowledge; anything else is ignored."""
            if raw.strip():
                with contextlib.suppress(ProtocolError):
                    bundle.acknowledge(parse_ack(raw))

        await read_while(pusher, receive, acknowledge)
    finally:
        hub.detach(bundle)
        try:  # a store error that ended the pusher is raised (and logged) after what it queued is given back
            if pusher is not None:
                pusher.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
                    await pusher
        finally:
            bundle.forget()
