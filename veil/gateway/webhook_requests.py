"""The HTTP side of webhook delivery: requests to endpoints that clients named, made so that no
client can aim the broker at what only the broker reaches, nor hold up anybody else's requests.

- Every address a request connects to is checked as the socket is made (`security.endpoints`):
  after the name is resolved, so a name that resolves to a public address when the subscription is
  made and to 127.0.0.1 later (DNS rebinding) still gets no request there.
- Names are resolved by c-ares (aiodns), without threads and within RESOLVE_SECONDS: a client's
  name served slowly on purpose holds up only that client's requests (a thread pool would be held
  by them for everyone).
- Redirects are not followed (a public endpoint could redirect inward), proxies from the
  environment are not used, cookies are neither kept nor sent, and the answer's body is never read.
- An owner has at most OWNER_REQUESTS requests under way at once, and the pool all share is large
  enough (CONNECTIONS) that nobody waits for it: each request's --webhook-timeout is its own
  endpoint's time.
- What failed is said without the URL's path or query (they may hold a secret) and without the
  addresses a name resolved to (a client learns nothing of the broker's network from it).
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
from veil.gateway.webhook_runs import RESOLVE_SECONDS
from veil.protocol import ProtocolError
from veil.security.endpoints import Network, allowed

log = logging.getLogger("veil.gateway")
OWNER_REQUESTS = 8  # requests of one owner's subscriptions under way at once
CONNECTIONS = 4096  # and of all owners together: a bound on sockets, not a pool anyone waits for
USER_AGENT = "Veil-Webhook/1"
MOST_RETRY_AFTER = 300.0  # seconds: an endpoint's Retry-After is honoured up to this
NOT_ALLOWED = "is neither a public address nor in the broker's --webhook-allow"


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


async def check_endpoint(url: str, allow: tuple[Network, ...], names: aiohttp.AsyncResolver) -> None:
    """Refuse (400, `webhook.url`) an endpoint whose host does not resolve, or resolves to any
    address requests may not go to. (Checked again at every connection: this is for the client to
    hear of it when it subscribes.)"""
    parsed = URL(url)
    host = parsed.raw_host or ""
    try:
        async with asyncio.timeout(RESOLVE_SECONDS):
            found = await names.resolve(host, parsed.port or 443, family=socket.AF_UNSPEC)
    except (OSError, TimeoutError, UnicodeError, ValueError):
        raise ProtocolError("webhook.url", f"the host {host!r} does not resolve") from None
    if not all(allowed(str(address["host"]), allow) for address in found):
        raise ProtocolError("webhook.url", f"{host} resolves to an address that {NOT_ALLOWED}")


class Poster:
    """One HTTP client for all of a gateway's webhook requests."""

    def __init__(self, config: Config, names: aiohttp.AsyncResolver) -> None:
        self.allow = config.webhook_networks
        self.timeout = config.webhook_timeout
        context = ssl.create_default_context()
        if config.webhook_ca is not None:
            context.load_verify_locations(config.webhook_ca)
        connector = aiohttp.TCPConnector(
            ssl=context, limit=CONNECTIONS, limit_per_host=0, resolver=names, socket_factory=self._socket
        )
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=config.webhook_timeout),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False,
            headers={"User-Agent": USER_AGENT},
        )  # fmt: skip
        self._owners: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def _socket(self, info: AddrInfoType) -> socket.socket:
        family, kind, proto, _, address = info
        if not allowed(str(address[0]), self.allow):
            raise Refused(errno.EACCES, f"an address the host resolved to {NOT_ALLOWED}")
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
                return Outcome(f"no answer within {self.timeout:g} s")
            except aiohttp.ClientConnectorError as exc:
                return Outcome(f"cannot connect: {_why(exc.os_error)}")
            except (aiohttp.ClientError, OSError) as exc:
                return Outcome(f"the request failed ({type(exc).__name__})")

    async def close(self) -> None:
        await self.session.close()


def _why(error: OSError) -> str:
    """Why a connection failed, without the addresses the name resolved to (a strerror may hold them)."""
    if isinstance(error, Refused):
        return str(error.strerror)
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or type(error).__name__}"
    return errno.errorcode.get(error.errno or 0, type(error).__name__)


def _retry_after(text: str | None) -> float | None:
    """Retry-After in seconds (its HTTP-date form is ignored: the backoff applies then)."""
    if text is not None and text.isascii() and text.isdigit() and len(text) <= 6:
        return min(float(text), MOST_RETRY_AFTER)
    return None
