"""The HTTP side of webhook delivery: requests to endpoints that clients named, made so that no
client can aim the broker at what only the broker reaches.

- Every address a request connects to is checked as the socket is made (`security.endpoints`):
  after the name is resolved, so a name that resolves to a public address when the subscription is
  made and to 127.0.0.1 later (DNS rebinding) still gets no request there.
- Redirects are not followed (a public endpoint could redirect inward), proxies from the
  environment are not used, cookies are neither kept nor sent, and the answer's body is never read.
- Each request has a total timeout (`--webhook-timeout`); an owner has at most OWNER_REQUESTS under
  way at once, so that one client's slow endpoints cannot hold up everyone's deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from typing import NamedTuple

import aiohttp
from aiohappyeyeballs import AddrInfoType
from yarl import URL

from veil.config import Config
from veil.protocol import ProtocolError
from veil.security.endpoints import Network, allowed

log = logging.getLogger("veil.gateway")
CONNECTIONS = 256  # requests under way at once, all endpoints together
OWNER_REQUESTS = 8  # and of one owner's subscriptions
HOST_CONNECTIONS = 16  # connections kept to one endpoint
USER_AGENT = "Veil-Webhook/1"
MOST_RETRY_AFTER = 300.0  # seconds: an endpoint's Retry-After is honoured up to this


class Refused(OSError):
    """An address the operator's allowlist does not let requests go to."""


class Outcome(NamedTuple):
    """A request's result: None if the endpoint took it (2xx), else why not, and how long the
    endpoint asked to be left alone (Retry-After), if it did."""

    problem: str | None
    retry_after: float | None = None


def shown(url: str) -> str:
    """The URL as logs show it: scheme, host and port only (a path or query may hold a secret)."""
    return str(URL(url).origin())


def refusal(address: str, allow: tuple[Network, ...]) -> str | None:
    if allowed(address, allow):
        return None
    return f"{address} is neither a public address nor in the broker's --webhook-allow"


async def check_endpoint(url: str, allow: tuple[Network, ...]) -> None:
    """Refuse (400, `webhook.url`) an endpoint whose host does not resolve, or resolves to any
    address requests may not go to. (Checked again at every connection: this is for the client to
    hear of it when it subscribes.)"""
    parsed = URL(url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parsed.host, parsed.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ProtocolError("webhook.url", f"the host {parsed.host!r} does not resolve ({exc})") from None
    for info in infos:
        problem = refusal(str(info[4][0]), allow)
        if problem is not None:
            raise ProtocolError("webhook.url", f"{parsed.host}: {problem}")


class Poster:
    """One HTTP client for all of a gateway's webhook requests."""

    def __init__(self, config: Config) -> None:
        self.allow = config.webhook_networks
        context = ssl.create_default_context()
        if config.webhook_ca is not None:
            context.load_verify_locations(config.webhook_ca)
        connector = aiohttp.TCPConnector(
            ssl=context, limit=CONNECTIONS, limit_per_host=HOST_CONNECTIONS, socket_factory=self._socket
        )
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=config.webhook_timeout),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False,
            headers={"User-Agent": USER_AGENT},
        )  # fmt: skip
        self._owners: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def _socket(self, info: AddrInfoType) -> socket.socket:
        family, kind, proto, _, address = info
        problem = refusal(str(address[0]), self.allow)
        if problem is not None:
            raise Refused(errno.EACCES, problem)
        return socket.socket(family, kind, proto)

    @contextlib.asynccontextmanager
    async def _turn(self, owner: str) -> AsyncIterator[None]:
        """One of the owner's OWNER_REQUESTS places."""
        semaphore, users = self._owners.get(owner) or (asyncio.Semaphore(OWNER_REQUESTS), 0)
        self._owners[owner] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._owners[owner]
            if users == 1:
                del self._owners[owner]
            else:
                self._owners[owner] = (semaphore, users - 1)

    async def post(self, owner: str, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        async with self._turn(owner):
            try:
                async with self.session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                    if 200 <= response.status < 300:
                        return Outcome(None)
                    retry_after = _retry_after(response.headers.get("Retry-After"))
                    return Outcome(f"answered HTTP {response.status}", retry_after)
            except TimeoutError:
                return Outcome(f"no answer within {self.session.timeout.total:g} s")
            except (aiohttp.ClientError, OSError) as exc:
                return Outcome(f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await self.session.close()


def _retry_after(text: str | None) -> float | None:
    """Retry-After in seconds (its HTTP-date form is ignored: the backoff applies then)."""
    if text is not None and text.isascii() and text.isdigit() and len(text) <= 6:
        return min(float(text), MOST_RETRY_AFTER)
    return None
