"""Asyncio client for Veil: publish, subscribe, unsubscribe, and a delivery stream.

The stream asks for the envelope and acknowledgements by default: it acknowledges what the
application has consumed and resumes after it when it reconnects, so the application sees each
publication once per subscription even across broker restarts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import random
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, urlsplit

import aiohttp
import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from veil.client.channels import Channel, TcpChannel, WebSocketChannel
from veil.client.errors import (
    FATAL,
    BrokerFault,
    NotFound,
    Overloaded,
    Replaced,
    TamperedPublication,
    UntrustedKey,
    VeilError,
    error_from_body,
    error_from_document,
)
from veil.client.scope_keys import Rotation, next_version
from veil.client.sealed import Origin, ReplayWindow, ScopeKeyring, origin_of, seal_publication
from veil.protocol.envelope import published_bytes
from veil.protocol.limits import INT64_MAX
from veil.security import signatures
from veil.security.sealing import RecipientKey, SealError
from veil.security.tls import client_context

ERROR_KEYS = frozenset({"error", "field", "status"})
MAX_FAILURES = 60
ACK_EVERY = 256
# seconds after which what was consumed is acknowledged anyway: a slow consumer of a group is not
# closed by the broker's --ack-wait for acknowledging only every ACK_EVERY deliveries
ACK_AFTER = 1.0
REGISTRY_VERSION = "X-Registry-Version"  # the registry version an answer shows, and a change is based on
RETRY_FIRST, RETRY_MOST = 0.1, 2.0  # seconds between attempts at a publish: the first wait, and the longest
CHANGE_ATTEMPTS = 8  # read-modify-write changes redone after another client's change came first (409)
T = TypeVar("T")


class Delivery(NamedTuple):
    seq: int | None
    id: str | None
    publication: dict
    publisher: str | None = None
    verified: bool = False  # its signature verified against a key the application trusts
    cropped: bool = False  # fields were removed from this copy for this subscriber
    payload: bytes | None = None  # its sealed payload, opened (None: none, or not sealed for us)
    # why its sealed payload did not open (tampered with, or malformed): the delivery still comes, so
    # that no one (a member sealing garbage, a broker) can stop a scope's subscribers with one publication
    payload_error: str | None = None
    subscription_ids: tuple[str, ...] = ()  # on a multiplexed stream: the subscriptions it is delivered to
    origin: Origin | None = None  # who sealed it, when, under which id, once its payload opened


class VeilClient:
    def __init__(
        self,
        url: str = "http://127.0.0.1:20000",
        *,
        auth_hash: str | None = None,
        token: str | None = None,
        trusted_keys: dict[str, dict[str, str]] | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        tcp_port: int | None = None,
        ws_port: int | None = None,
        recipient_key: RecipientKey | None = None,
        scope_managers: dict[str, dict[str, str]] | None = None,
        scope_versions: dict[str, int] | None = None,
        timeout: float = 30.0,
        publish_retry: float = 30.0,
    ) -> None:
        """`recipient_key` is the private half of the key the registry lists for this client under
        `recipients` (X25519, or `HybridKey` for ML-KEM-768 with X25519): scope keys are wrapped for
        it, so it seals and opens payloads. `scope_managers` pins, per scope, the Ed25519 public keys
        (key id -> base64) of the managers whose signed rosters this client believes: a scope key is
        used only as a roster one of them signed gives it. `scope_versions` (scope -> the newest key
        version seen) is kept up to date in place: an application that saves it and passes it again
        after a restart is not rolled back below what it saw before. A publish whose answer was lost
        (the connection failed or was cut off, or `timeout` passed) or that was refused for now (503)
        is sent again, under the same idempotency key, for up to `publish_retry` seconds: it is
        published once."""
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tcp_port = tcp_port or port + 1
        self.ws_port = ws_port or port + 2
        self.auth_hash = auth_hash
        self.token = token
        # publisher -> key id -> base64 Ed25519 public key: signed deliveries from these publishers
        # are verified end to end, and refused when they do not verify
        self.trusted_keys = {
            publisher: {key_id: base64.b64decode(key) for key_id, key in keys.items()}
            for publisher, keys in (trusted_keys or {}).items()
        }
        self.ssl: ssl.SSLContext | None = (
            client_context(ca_file, cert_file, key_file) if parts.scheme == "https" else None
        )
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self.publish_retry = publish_retry
        self._http: aiohttp.ClientSession | None = None
        self.positions: dict[str, int] = {}  # last consumed sequence number per subscription
        self.registry_version: int | None = None  # of the registry this client last read or changed
        self.scope_managers = {
            scope: {key_id: base64.b64decode(key) for key_id, key in keys.items()}
            for scope, keys in (scope_managers or {}).items()
        }
        self.scope_versions = {} if scope_versions is None else scope_versions
        self.keyring = (
            ScopeKeyring(recipient_key, self.scope_managers, self._envelope, self.scope_versions)
            if recipient_key is not None
            else None
        )

    async def __aenter__(self) -> VeilClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl if self.ssl is not None else False, limit=64)
            self._http = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._http

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = {"Content-Type": content_type}
        if self.auth_hash is not None:
            headers["X-Auth-Hash"] = self.auth_hash
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def request(
        self,
        path: str,
        body: bytes,
        content_type: str = "application/json",
        extra: dict[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        headers = {**self._headers(content_type), **(extra or {})}
        async with self.http().request(method, f"{self.url}{path}", data=body, headers=headers) as response:
            payload = await response.read()
            version = response.headers.get(REGISTRY_VERSION)
            if version is not None and version.isdigit():
                self.registry_version = int(version)
            if response.status != 200:
                error = error_from_body(response.status, payload)
                after = response.headers.get("Retry-After", "")
                if isinstance(error, Overloaded) and after.isascii() and after.isdigit():
                    error.retry_after = float(after)
                raise error
            return orjson.loads(payload) if payload else None

    async def publish(
        self,
        publication: dict | list | bytes,
        *,
        signing_key: tuple[str, Ed25519PrivateKey] | None = None,
        valid_for: int | None = None,
        seal: str | None = None,
        payload: bytes | None = None,
        idempotency_key: str | None = None,
        retry_for: float | None = None,
    ) -> str:
        """Publish; with `signing_key` (key id, private key) the exact bytes sent are signed; with
        `valid_for` (milliseconds) the publication is kept that long and subscriptions made meanwhile
        receive it too; with `seal` (a scope), `payload` is sealed for the scope's members beside the
        publication's attributes (a dict), which route it in clear. `idempotency_key` names the
        publication (a random one by default): the broker logs it once, however often it is sent
        within its idempotency window; `retry_for` is this publish's `publish_retry` (0: sent once)."""
        if seal is not None:
            return await self._publish_sealed(
                publication, seal, payload or b"", signing_key, valid_for, idempotency_key, retry_for
            )
        body = publication if isinstance(publication, bytes) else orjson.dumps(publication)
        extra: dict[str, str] = {}
        if signing_key is not None:
            key_id, private = signing_key
            extra.update({"X-Key-Id": key_id, "X-Signature": signatures.sign(private, body)})
        if valid_for is not None:
            extra["X-Valid-For"] = str(valid_for)
        return (await self._published(body, "application/json", extra, idempotency_key, retry_for))["id"]

    async def _published(
        self, body: bytes, content_type: str, extra: dict[str, str], key: str | None, retry_for: float | None
    ) -> Any:
        """The answer to a publish, sent again under its idempotency key while no answer came (or
        one cut short) or the broker was overloaded, backing off with jitter (or as long as the broker
        asked), for up to `retry_for` seconds (`publish_retry` by default) after the first attempt."""
        headers = {**extra, "Idempotency-Key": key or uuid.uuid4().hex}
        deadline = time.monotonic() + (self.publish_retry if retry_for is None else retry_for)
        wait = RETRY_FIRST
        while True:
            try:
                return await self.request("/publish", body, content_type, headers)
            except (aiohttp.ClientSSLError, aiohttp.ClientConnectorDNSError):  # they would be again
                raise
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError, Overloaded) as exc:
                pause = wait * random.uniform(0.5, 1.0)
                if isinstance(exc, Overloaded) and exc.retry_after is not None:
                    pause = max(pause, exc.retry_after)
                if time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            wait = min(2 * wait, RETRY_MOST)

    async def _publish_sealed(
        self,
        attributes: object,
        scope: str,
        payload: bytes,
        signing_key: tuple[str, Ed25519PrivateKey] | None,
        valid_for: int | None,
        idempotency_key: str | None,
        retry_for: float | None,
    ) -> str:
        if not isinstance(attributes, dict):
            raise TypeError("a sealed publication's attributes are a dict")
        if self.keyring is None:
            raise VeilError("veil:sealed", "sealing needs the client's recipient_key", 0)
        keyring = self.keyring

        async def sealed_and_published() -> str:
            try:
                key = await keyring.key(scope)
            except SealError as exc:
                raise UntrustedKey("veil:sealed", str(exc), 0) from None
            if key is None:
                raise VeilError("veil:sealed", f"the broker has no key of scope {scope!r} for this client", 0)
            body = orjson.dumps(seal_publication(attributes, payload, key, keyring.names[(scope, key.version)]))
            return await self.publish(
                body, signing_key=signing_key, valid_for=valid_for, idempotency_key=idempotency_key, retry_for=retry_for
            )

        try:
            return await sealed_and_published()
        except Replaced as exc:  # the key was rotated since we fetched it: once more with the newest
            if exc.field != "veil:sealed":
                raise
            keyring.forget_newest(scope)
            return await sealed_and_published()

    async def _envelope(self, scope: str, version: int | None) -> dict | None:
        query = "" if version is None else f"?version={version}"
        try:
            reply = await self.request(f"/scopes/{quote(scope, safe='')}/key{query}", b"", method="GET")
        except NotFound:
            return None
        return reply if isinstance(reply, dict) else {}

    async def rotate_scope_key(
        self,
        scope: str,
        signing_key: tuple[str, Ed25519PrivateKey],
        recipients: dict[str, bytes] | None = None,
    ) -> Rotation:
        """As the scope's manager: a new key version in a roster signed with `signing_key` (key id,
        private key; its public half registered for you and pinned by members in `scope_managers`),
        for exactly the members in `recipients` (member -> raw public key) that the registry lists in
        the scope with those keys, or without `recipients`, for the last roster's members the registry
        still lists (see veil.client.scope_keys). Members left out are reported with why. When
        another rotation or registry change came first (409), rotates again from the newest."""
        pinned = self.scope_managers.get(scope, {})

        async def rotated() -> Rotation:
            path = f"/scopes/{quote(scope, safe='')}"
            described = await self.request(path, b"", method="GET")
            seen = self.scope_versions.get(scope, 0)
            try:
                body, rotation = next_version(scope, described, signing_key, recipients, pinned, seen)
            except SealError as exc:
                raise UntrustedKey("roster", str(exc), 0) from None
            await self.request(f"{path}/keys/{rotation.version}", orjson.dumps(body), method="PUT")
            self.scope_versions[scope] = max(rotation.version, self.scope_versions.get(scope, 0))
            return rotation

        return await _redone(rotated, lambda field: field in ("version", REGISTRY_VERSION))

    async def announce(self, data: list[dict], announcement_id: str | None = None) -> dict:
        """As an edge broker: announce what its publishers can produce (constraints, as `data` of a
        subscription); see veil.client.edge."""
        doc: dict[str, Any] = {"data": data}
        if self.auth_hash is not None:
            doc["authHash"] = self.auth_hash
        if announcement_id:
            doc["announcementId"] = announcement_id
        reply = await self.request("/announce", orjson.dumps(doc))
        self.tcp_port = reply.get("port", self.tcp_port)
        return reply

    async def revoke(self, announcement_id: str) -> None:
        doc: dict[str, Any] = {"announcementId": announcement_id}
        if self.auth_hash is not None:
            doc["authHash"] = self.auth_hash
        await self.request("/revoke", orjson.dumps(doc))

    async def unpublish(self, publication_id: str) -> None:
        """Withdraw a publication of yours that is still valid."""
        doc: dict[str, Any] = {"id": publication_id}
        if self.auth_hash is not None:
            doc["authHash"] = self.auth_hash
        await self.request("/unpublish", orjson.dumps(doc))

    async def registry(self, document: dict | None = None, *, version: int | None = None) -> dict:
        """The broker's registry (admins only); with `document`, replace it first: the version it was
        made from is `version`, by default the one this client last read (`registry_version`). If
        another change was stored since, the broker refuses (`Replaced`, 409) and nothing changes:
        `change_registry` reads, edits and writes again until its change lands."""
        if document is None:
            return await self.request("/admin/registry", b"", method="GET")
        base = self.registry_version if version is None else version
        extra = None if base is None else {REGISTRY_VERSION: str(base)}
        return await self.request("/admin/registry", orjson.dumps(document), extra=extra, method="PUT")

    async def change_registry(self, edit: Callable[[dict], None]) -> dict:
        """Change the registry (admins only): `edit` changes the newest document in place; when another
        change was stored between the read and the write, the change is made again on the newer one."""

        async def changed() -> dict:
            document = await self.registry()
            version = self.registry_version  # this read's, whatever other calls read meanwhile
            edit(document)
            return await self.registry(document, version=version)

        return await _redone(changed, lambda field: field == REGISTRY_VERSION)

    async def publish_batch(
        self, publications: list[dict], idempotency_key: str | None = None, retry_for: float | None = None
    ) -> list[str]:
        """Publish in one request (NDJSON), retried as `publish` is: line N under the key `KEY#N`."""
        body = b"\n".join(orjson.dumps(p) for p in publications)
        return (await self._published(body, "application/x-ndjson", {}, idempotency_key, retry_for))["ids"]

    async def subscribe(
        self,
        data: list[dict],
        subscription_id: str | None = None,
        *,
        topk: dict | None = None,
        scope: str | None = None,
        since: datetime | int | None = None,
        limits: dict[str, int] | None = None,
        webhook: dict[str, Any] | None = None,
    ) -> dict:
        """`topk` makes it a top-k subscription: {"k": K, "w": MILLISECONDS, "score": [TERM, ...]}, or
        "n": COUNT instead of "w" for the last COUNT matches; `scope` makes it in that scope (the
        world by default); `since` (an aware datetime, or milliseconds since the epoch) has it
        receive first what it matches of the publications the broker retains that were logged
        from then on; `limits` ({"deliveries": N, "bytes": N, "age": MILLISECONDS}, any of them) bound
        its queue below the broker's bounds: what is past them goes to its dead letters; `webhook`
        ({"url": "https://...", "batch": N}) has the broker POST its deliveries there instead of a
        connection (the answer holds the secret that signs them: `verify_webhook`)."""
        doc: dict[str, Any] = {"data": data}
        if topk is not None:
            doc["topk"] = topk
        if scope is not None:
            doc["scope"] = scope
        if isinstance(since, datetime):
            if since.utcoffset() is None:
                raise ValueError("since: an aware datetime (a naive one means whatever this machine's zone is)")
            since = math.floor(since.timestamp() * 1000)
        if since is not None:
            doc["since"] = since
        if limits is not None:
            doc["limits"] = limits
        if webhook is not None:
            doc["webhook"] = webhook
        if self.auth_hash is not None:
            doc["authHash"] = self.auth_hash
        if subscription_id:
            doc["subscriptionId"] = subscription_id
        reply = await self.request("/subscribe", orjson.dumps(doc))
        # The broker says where this subscription's deliveries are served (SPEC §2.2).
        self.tcp_port = reply.get("port", self.tcp_port)
        self.ws_port = reply.get("ws-port", self.ws_port)
        return reply

    async def unsubscribe(self, subscription_id: str) -> None:
        doc: dict[str, Any] = {"subscriptionId": subscription_id}
        if self.auth_hash is not None:
            doc["authHash"] = self.auth_hash
        await self.request("/unsubscribe", orjson.dumps(doc))

    async def subscriptions(self) -> list[dict]:
        """Your live subscriptions as /subscribe took them (id, data, scope, topk, created), in id order."""
        listed: list[dict] = []
        after = ""
        while True:
            page = await self.request(f"/subscriptions?after={quote(after, safe='')}", b"", method="GET")
            listed.extend(page["subscriptions"])
            if page["next"] is None:
                return listed
            after = page["next"]

    async def subscription(self, subscription_id: str) -> dict:
        """One live subscription of yours (`VeilError` 404 when you hold none of that id)."""
        return await self.request(f"/subscriptions/{quote(subscription_id, safe='')}", b"", method="GET")

    async def dead_letters(self, subscription_id: str, after: int = 0) -> AsyncIterator[dict]:
        """A subscription's dead letters (yours, or any one's for an admin), oldest first, read a page
        at a time: each as it would have been delivered (`id`, `publisher`, `publication`, ...) with
        its `seq`, the `reason` it left the queue (`deliveries`, `bytes` or `age`) and when (`at`)."""
        path = f"/subscriptions/{quote(subscription_id, safe='')}/dead-letters"
        while True:
            page = await self.request(f"{path}?after={after}", b"", method="GET")
            for letter in page["deadLetters"]:
                yield letter
            if page["next"] is None:
                return
            after = int(page["next"])

    async def replay_dead_letters(self, subscription_id: str, upto: int | None = None) -> int:
        """Queue a subscription's dead letters (up to seq `upto`) again, in their order; how many (the
        broker takes a bounded number a request: this asks until none is left)."""
        body = orjson.dumps({} if upto is None else {"upto": upto})
        path = f"/subscriptions/{quote(subscription_id, safe='')}/dead-letters/replay"
        replayed = 0
        while True:
            answer = await self.request(path, body)
            replayed += int(answer["replayed"])
            if not answer["left"] or not answer["replayed"]:
                return replayed

    async def purge_dead_letters(self, subscription_id: str, upto: int | None = None) -> int:
        """Drop a subscription's dead letters (up to seq `upto`); how many."""
        query = "" if upto is None else f"?upto={upto}"
        path = f"/subscriptions/{quote(subscription_id, safe='')}/dead-letters{query}"
        return int((await self.request(path, b"", method="DELETE"))["purged"])

    async def open_channel(self, transport: str = "tcp") -> Channel:
        """A connection to the broker's delivery port for `transport` ("tcp" or "ws")."""
        if transport == "ws":
            return await WebSocketChannel.open(self.http(), self.host, self.ws_port, self.ssl)
        return await TcpChannel.open(self.host, self.tcp_port, self.ssl)

    def deliveries(
        self,
        subscription_id: str,
        *,
        transport: str = "tcp",
        envelope: bool = True,
        group: bool = False,
        consumed_on_next: bool = False,
    ) -> DeliveryStream:
        """The subscription's deliveries; with `group`, as one member of its group: each delivery
        goes to one member, and what one leaves unacknowledged goes to another. With
        `consumed_on_next`, a delivery counts as consumed (acknowledged, and resumed after) only when
        the next one is asked for, not when it is handed over: for an application that hands each on
        and must not lose one it was handling when its connection dropped (it may see it twice)."""
        return DeliveryStream(self, subscription_id, transport, envelope, group, consumed_on_next)

    def multiplexed(self, subscription_ids: Sequence[str], *, transport: str = "tcp") -> MultiplexedStream:
        """The deliveries of many subscriptions over one connection: each publication once, with the
        ids of the subscriptions it is delivered to (`Delivery.subscription_ids`)."""
        return MultiplexedStream(self, subscription_ids, transport)

    async def listen(
        self, subscription_id: str, callback: Callable[[Delivery], Awaitable[None] | None], **kw: Any
    ) -> None:
        """Call `callback` for every delivery until cancelled."""
        async with self.deliveries(subscription_id, **kw) as stream:
            async for delivery in stream:
                result = callback(delivery)
                if asyncio.iscoroutine(result):
                    await result


async def _redone(change: Callable[[], Awaitable[T]], conflicting: Callable[[str], bool]) -> T:
    """A read-modify-write `change`, made again from the start while another client's change came
    first (409 naming a field that is `conflicting`), up to CHANGE_ATTEMPTS times in all."""
    for _ in range(CHANGE_ATTEMPTS - 1):
        try:
            return await change()
        except Replaced as exc:
            if not conflicting(exc.field):
                raise
    return await change()


class DeliveryStream:
    """Async iterator of deliveries over TCP or WebSocket, reconnecting after connection loss.

    A reconnect resumes after the last delivery consumed (`resumeAfter`), and what was received and
    not yet consumed is dropped from the queue, to come again: the broker takes a resume point for
    what the client consumed, and a standby that takes over the subscription starts there. A broker
    that honours `resumeAfter` never sends anything at or below it; if one does, the repeat is
    dropped and counted in `dropped_duplicates`, so that the application sees each delivery once and
    a test sees the broker's fault. Acknowledgements start afresh on each connection: an older
    line's seq may name a different line on the new one.

    A member of a group (`group`) resumes where the group stands, and takes lines out of order (those
    another member left come after newer ones), so it has no resume point of its own."""

    def __init__(
        self,
        client: VeilClient,
        subscription_id: str,
        transport: str,
        envelope: bool,
        group: bool = False,
        consumed_on_next: bool = False,
    ) -> None:
        if transport not in ("tcp", "ws"):
            raise ValueError("transport is 'tcp' or 'ws'")
        if group and not envelope:
            raise ValueError("a group member takes its deliveries in the envelope (their seqs are acknowledged)")
        self.group = group
        self.client = client
        self.subscription_id = subscription_id
        self._replays = ReplayWindow()
        self.transport = transport
        self.envelope = envelope
        self.last_seq: int | None = None if group else client.positions.get(subscription_id)  # the last consumed
        self._received = self.last_seq  # the last one queued: what is at or below it is a repeat
        self.dropped_duplicates = 0
        self.reconnects = 0
        self._lines: asyncio.Queue[tuple[bytes, Any] | BaseException] = asyncio.Queue(maxsize=1024)
        self._ackable: int | None = None  # the last consumed line of the current connection
        self._acked: int | None = None
        self._unacked = 0
        self._acked_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._send: Callable[[bytes], Awaitable[None]] | None = None
        self.connected = asyncio.Event()
        self.consumed_on_next = consumed_on_next
        self._handed: tuple[int, tuple[str, ...]] | None = None  # handed over, to count as consumed at the next

    async def __aenter__(self) -> DeliveryStream:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                await self._acknowledge()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        if self._task is None:
            await self.__aenter__()
        if self._handed is not None:
            self._settle(*self._handed)
            self._handed = None
        if self._lines.empty() or self._unacked >= ACK_EVERY or time.monotonic() - self._acked_at >= ACK_AFTER:
            await self._acknowledge()
        item = await self._lines.get()
        if isinstance(item, BaseException):
            raise item
        delivery = self._parse(*item)
        if delivery.seq is not None:
            if self.consumed_on_next:
                self._handed = (delivery.seq, delivery.subscription_ids)
            else:
                self._settle(delivery.seq, delivery.subscription_ids)
        if self.client.keyring is not None and isinstance(delivery.publication, dict):
            delivery = await self._opened(self.client.keyring, delivery)
        return delivery

    async def _opened(self, keyring: ScopeKeyring, delivery: Delivery) -> Delivery:
        """The delivery with its sealed payload opened, or with why it is not authentic: it does not
        open, it names no origin or another publisher than the one who published it, or one of its
        subscriptions got it before (a replay)."""
        try:
            payload = await keyring.open(delivery.publication)
        except SealError as exc:
            return delivery._replace(payload_error=str(exc))
        except (VeilError, aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:
            # its key could not be fetched or read (the broker failed, or sent junk): the delivery is
            # consumed already, so it comes with why; keyring.open(delivery.publication) tries again
            return delivery._replace(payload_error=f"its key could not be fetched: {exc}")
        if payload is None:
            return delivery
        origin = origin_of(delivery.publication)
        if origin is None:
            return delivery._replace(payload_error="sealed without an origin (publisher, id, time)")
        delivery = delivery._replace(origin=origin)
        if delivery.publisher is not None and origin.publisher != delivery.publisher:
            problem = f"sealed by {origin.publisher!r} but published by {delivery.publisher!r}"
            return delivery._replace(payload_error=problem)
        if self._replays.replayed(origin, delivery.subscription_ids or (self.subscription_id,)):
            problem = f"a replay: {origin.publisher!r}'s publication {origin.id} was delivered before"
            return delivery._replace(payload_error=problem)
        return delivery._replace(payload=payload)

    def _settle(self, seq: int, subscription_ids: tuple[str, ...]) -> None:
        """A delivery the application took: consumed, and acknowledged with the next acknowledgement."""
        self._consumed(seq, subscription_ids)
        self._ackable = seq
        self._unacked += 1

    def _consumed(self, seq: int, subscription_ids: tuple[str, ...]) -> None:
        self.last_seq = seq
        if not self.group:
            self.client.positions[self.subscription_id] = seq

    def _restart(self) -> None:
        """Before a new connection: unconsumed lines are dropped (they come again, after the resume
        point, as does one handed over and not yet counted consumed), and nothing is acknowledged
        until a line of the new connection is consumed."""
        while not self._lines.empty():
            self._lines.get_nowait()
        self._handed = None  # not consumed: it comes again after the resume point
        self._received = self.last_seq
        self._ackable = self._acked = None
        self._unacked = 0

    def _fresh(self, doc: dict) -> bool:
        """Whether this enveloped delivery is new to the stream (a re-send is counted, then dropped)."""
        seq = doc["seq"]
        if self.group:
            return True
        if self._received is not None and seq <= self._received:
            self.dropped_duplicates += 1
            return False
        self._received = seq
        return True

    def _parse(self, line: bytes, doc: Any) -> Delivery:
        if not self.envelope:
            return Delivery(None, None, doc)
        seq = doc["seq"]
        publisher = doc.get("publisher")
        if not isinstance(publisher, str):
            publisher = None  # none named, or not a name: nothing is attributed to anyone
        verified = False
        keys = self.client.trusted_keys.get(publisher) if publisher is not None else None
        if keys is not None and "signature" in doc:
            key_id, signature = doc.get("keyId"), doc["signature"]
            key = keys.get(key_id) if isinstance(key_id, str) else None
            authentic = (
                key is not None and isinstance(signature, str)
                and signatures.verifies(key, published_bytes(line), signature)
            )  # fmt: skip
            if not authentic:
                self._consumed(seq, tuple(doc.get("subscriptionIds", ())))
                raise TamperedPublication(
                    "signature", f"publication {doc.get('id')} from {publisher!r} does not verify", 0
                )
            verified = True
        return Delivery(seq, doc.get("id"), doc.get("publication"), publisher, verified, bool(doc.get("cropped")))

    async def _acknowledge(self) -> None:
        if self.envelope and self._ackable is not None and self._ackable != self._acked and self._send is not None:
            with contextlib.suppress(Exception):
                await self._send(orjson.dumps({"ack": self._ackable}))
                self._acked = self._ackable
                self._unacked = 0
                self._acked_at = time.monotonic()

    def _handshake(self) -> bytes:
        doc: dict[str, Any] = {"subscriptionId": self.subscription_id}
        if self.client.auth_hash is not None:
            doc["authHash"] = self.client.auth_hash
        if self.client.token is not None:
            doc["token"] = self.client.token
        if self.envelope:
            doc.update(envelope=True, ack=True)
            if self.group:
                doc["group"] = True
            elif self._received is not None:
                doc["resumeAfter"] = self._received
        return orjson.dumps(doc)

    def _document(self, line: bytes) -> Any:
        """The line's JSON document; VeilError for an error the broker sent, BrokerFault for a line
        the protocol does not allow."""
        doc = _load(line)
        if not self.envelope:
            if isinstance(doc, dict) and set(doc) == ERROR_KEYS:
                raise error_from_document(doc)
            return doc
        if not isinstance(doc, dict):
            raise BrokerFault("", f"not an envelope: {line[:200]!r}", 0)
        if "seq" not in doc:
            raise error_from_document(doc)
        seq = doc["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= INT64_MAX:
            raise BrokerFault("seq", f"not a sequence number: {line[:200]!r}", 0)
        return doc

    async def _run(self) -> None:
        delay = 0.2
        failures = 0
        while True:
            try:
                await self._connect()
                error: BaseException | None = None
            except BrokerFault as exc:
                failures += 1
                error = exc if failures > MAX_FAILURES else None
            except VeilError as exc:
                error = exc if isinstance(exc, FATAL) else None
            except (OSError, aiohttp.ClientError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
                failures = 0 if self.connected.is_set() else failures + 1
                error = exc if failures > MAX_FAILURES else None
            except Exception as exc:  # a fault of this library's: the application sees it, never a hang
                error = exc
            self._send = None
            self.connected.clear()
            if error is not None:
                await self._lines.put(error)
                return
            self.reconnects += 1
            await asyncio.sleep(delay if failures else 0.05)
            delay = min(delay * 2, 2.0) if failures else 0.2

    async def _deliver(self, line: bytes) -> None:
        doc = self._document(line)
        if not self.envelope or self._fresh(doc):
            await self._lines.put((line, doc))

    async def _connect(self) -> None:
        """One connection's life: handshake, then deliveries until the broker closes it."""
        channel = await self.client.open_channel(self.transport)
        try:
            self._restart()
            await channel.send(self._handshake())
            self._send = channel.send
            self.connected.set()
            async for line in channel.documents():
                await self._deliver(line)
            raise ConnectionResetError("broker closed the connection")
        finally:
            await channel.close()


class MultiplexedStream(DeliveryStream):
    """Many subscriptions' deliveries over one connection (`VeilClient.multiplexed`). Each delivery
    names the subscriptions it is for. The connection's lines are not in one global order (a backlog
    read brings older publications after newer ones), so a reconnect resumes each subscription after
    the last delivery consumed for it (`resumeAfter` as a list, one per subscription). A subscription
    the broker ends (unsubscribed, quarantined) leaves the stream with its error in `ended`; the
    others go on."""

    def __init__(self, client: VeilClient, subscription_ids: Sequence[str], transport: str) -> None:
        super().__init__(client, "", transport, envelope=True)
        self.subscription_ids = list(dict.fromkeys(subscription_ids))
        self.ended: dict[str, VeilError] = {}
        self._carried = frozenset(self.subscription_ids)
        self._each: dict[str, int] = {}  # per subscription, the last one queued

    def _settle(self, seq: int, subscription_ids: tuple[str, ...]) -> None:
        """A delivery the application took: consumed, and acknowledged with the next acknowledgement."""
        self._consumed(seq, subscription_ids)
        self._ackable = seq
        self._unacked += 1

    def _consumed(self, seq: int, subscription_ids: tuple[str, ...]) -> None:
        for sub_id in subscription_ids:
            self.client.positions[sub_id] = seq
        self.last_seq = seq

    def _restart(self) -> None:
        super()._restart()
        positions = self.client.positions
        self._each = {s: positions[s] for s in self.subscription_ids if s in positions}

    def _fresh(self, doc: dict) -> bool:
        """Keeps, of the subscriptions the line names, those it is new to; counts the others."""
        seq, named = doc["seq"], doc.get("subscriptionIds")
        each = self._each
        if (
            not isinstance(named, list) or not named or len(set(named)) < len(named)
            or not all(isinstance(s, str) and s in self._carried for s in named)
        ):  # fmt: skip
            raise BrokerFault("subscriptionIds", f"line {seq} names subscriptions this connection does not carry", 0)
        fresh = [s for s in named if each.get(s, -1) < seq]
        self.dropped_duplicates += len(named) - len(fresh)
        for sub_id in fresh:
            each[sub_id] = seq
        doc["subscriptionIds"] = fresh
        return bool(fresh)

    def _parse(self, line: bytes, doc: Any) -> Delivery:
        return super()._parse(line, doc)._replace(subscription_ids=tuple(doc["subscriptionIds"]))

    def _handshake(self) -> bytes:
        doc: dict[str, Any] = {"subscriptionIds": self.subscription_ids, "envelope": True, "ack": True}
        if self.client.auth_hash is not None:
            doc["authHash"] = self.client.auth_hash
        if self.client.token is not None:
            doc["token"] = self.client.token
        if self._each:
            doc["resumeAfter"] = [self._each.get(s) for s in self.subscription_ids]
        return orjson.dumps(doc)

    async def _deliver(self, line: bytes) -> None:
        doc = _load(line) if line.startswith(b'{"error"') else None
        if isinstance(doc, dict) and "seq" not in doc:
            ended = doc.get("subscriptionId")
            if isinstance(ended, str) and ended in self._carried:
                self.ended[ended] = error_from_document(doc)
                self.subscription_ids = [s for s in self.subscription_ids if s != ended]
                return
        await super()._deliver(line)


def _load(line: bytes) -> Any:
    """A line's JSON document (BrokerFault when it is none: a line cut short by a connection that
    broke is one)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        raise BrokerFault("", f"unreadable line from the broker: {line[:200]!r}", 0) from None
