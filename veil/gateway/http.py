"""What REST handlers ask of a request: who sent it, and its body within the read timeout, parsed
off the event loop when it is large."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple

from aiohttp import web

from veil.gateway.context import GATEWAY, Gateway
from veil.protocol import ProtocolError
from veil.security.identity import Credentials, Principal
from veil.security.tls import fingerprint, peer_certificate

# routes that authenticate no one: answered without looking at the store's registry
PUBLIC_ROUTES = frozenset({"/health", "/ready", "/metrics", "/openapi.json", "/dashboard", "/dashboard/{asset}"})
# what takes no look at the store's registry first: the public routes, and those whose handlers
# check the registry's version where they write (`rest.publish`: the hot path)
UNLOOKED = PUBLIC_ROUTES | frozenset({"/publish"})
PARSE_OFF_LOOP = 64 * 1024  # bodies larger than this are parsed on a thread, so the loop serves others meanwhile
T = TypeVar("T")
Args = TypeVarTuple("Args")  # the arguments of the work handed to the parsing thread, checked


@web.middleware
async def current_registry(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A request that may authenticate someone waits for a look at the store's newest registry
    version (`CurrentRegistry.fresh`): a static hash revoked through another gateway is refused here
    as soon as the revocation was acknowledged."""
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical not in UNLOOKED:
        await request.app[GATEWAY].registry.fresh()
    return await handler(request)


def certificate_of(request: web.Request) -> bytes | None:
    """The client's verified certificate, if it showed one."""
    return peer_certificate(request.transport.get_extra_info("ssl_object") if request.transport else None)


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProtocolError("Authorization", "expected 'Bearer <token>'", 401)
    return token.strip()


def client_of(gateway: Gateway, request: web.Request, claimed: str | None) -> str:
    """Who sent the request: what its certificate or token proves, or the static hash it claims where
    the operator accepts those."""
    return principal_of(gateway, request, claimed).identity


def principal_of(gateway: Gateway, request: web.Request, claimed: str | None) -> Principal:
    """Who sent the request and what its credentials say it may do."""
    der = certificate_of(request)
    credentials = Credentials(fingerprint(der) if der else None, bearer_token(request), claimed, der)
    return gateway.auth.principal(credentials)


async def body_of(gateway: Gateway, request: web.Request) -> bytes:
    """The request's body, within the read timeout: a client that stops sending mid-body holds a
    connection, not the broker."""
    if request.content.is_eof():  # all of it arrived with the headers, as nearly always: no timer needed
        return await request.read()
    timeout = gateway.config.read_timeout
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        raise ProtocolError("body", f"not received within {timeout:g} s", 408) from None


async def parsed(gateway: Gateway, raw: bytes, parse: Callable[[bytes, *Args], T], *args: *Args) -> T:
    """`parse(raw, *args)`, on the parsing thread when the body is large."""
    return await sized(gateway, len(raw), parse, raw, *args)


async def sized(gateway: Gateway, size: int, work: Callable[[*Args], T], *args: *Args) -> T:
    """`work(*args)`, on the parsing thread when it works on a request body of `size` bytes that is
    large: what takes time in proportion to a body a client chose is kept off the event loop."""
    if size <= PARSE_OFF_LOOP:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(gateway.parsing, work, *args)
