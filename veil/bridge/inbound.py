"""MQTT → Veil: each message on a template's topics is published into Veil with the topic's levels
as attributes beside its JSON payload's members, and acknowledged to MQTT only after Veil's 200.

Messages are forwarded in the order they came, in groups (what arrived while the last group was
being published, as one NDJSON request): one group at a time, so Veil's log keeps MQTT's order. A
message Veil refuses for what it is (400, 403 and 413 about the publication: malformed, too deep,
not allowed for this bridge's identity), or whose topic or payload the bridge cannot read, is
logged and acknowledged (it would be refused again, and would hold back everything behind it);
anything else (Veil down or overloaded, the bridge's credential refused) is tried again, backing
off, while the messages stay unacknowledged at the MQTT broker.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import orjson

from veil.bridge.journal import Entry, Journal, digest
from veil.bridge.mqtt_link import MqttLink, Received
from veil.bridge.topics import TopicMismatch, TopicTemplate, shown
from veil.client import VeilClient
from veil.client.errors import Overloaded, VeilError
from veil.protocol import ProtocolError
from veil.protocol.publications import parse_publication
from veil.protocol.reserved import PREFIX

log = logging.getLogger("veil.bridge")

GROUP = 256  # messages in one publish request at most
GROUP_BYTES = 512 << 10  # and bytes of publications: well within Veil's --max-body (1 MiB by default)
MAX_PAYLOAD = 1 << 20  # bytes: a larger payload is refused before it is parsed
RETRY_FIRST, RETRY_MOST = 0.2, 5.0  # seconds between attempts while Veil cannot take a group
# a refusal naming one of these is about the bridge's credential, which the operator can mend: waited out
CREDENTIAL = frozenset({"authHash", "X-Auth-Hash", "token", "Authorization", "certificate", ""})


@dataclass
class Counts:
    received: int = 0
    published: int = 0
    repeated: int = 0  # redeliveries published again under the key they had
    rejected: int = 0
    stale: int = 0  # copies from a connection since replaced, which come again


def document(templates: list[TopicTemplate], topic: str, payload: bytes, value_attribute: str) -> bytes:
    """The publication a message makes: its JSON object's members (a JSON value that is no object, or
    UTF-8 text that is no JSON, under `value_attribute`), then the attributes of the first template its
    topic fits, which win over members of the same name: the topic is what the MQTT broker's access
    rules checked, the payload is whatever the device wrote. ValueError (TopicMismatch for the topic)
    if unusable: reserved `veil:` members, which a device may not set, included."""
    for template in templates:
        try:
            attributes = template.attributes(topic)
            break
        except TopicMismatch:
            continue
    else:
        raise TopicMismatch(f"topic {shown(topic)} fits no --topic template")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a payload of {len(payload)} bytes (at most {MAX_PAYLOAD})")
    try:
        value = msgspec.json.decode(payload)  # integers beyond 64 bits stay exact, to be refused below
    except RecursionError:
        raise ValueError("the payload is nested too deeply to read") from None
    except msgspec.DecodeError:
        if payload.lstrip()[:1] in (b"{", b"[", b'"'):
            raise ValueError("the payload is malformed JSON") from None
        try:
            value = payload.decode()
        except UnicodeDecodeError:
            raise ValueError("the payload is neither JSON nor UTF-8 text") from None
    members = value if isinstance(value, dict) else {value_attribute: value}
    reserved = [name for name in members if name.startswith(PREFIX)]
    if reserved:
        raise ValueError(f"the payload sets {reserved[0]!r}: members named {PREFIX}* are Veil's, not a device's")
    try:
        body = orjson.dumps({**members, **attributes})
    except TypeError as exc:
        raise ValueError(f"the payload holds what a publication cannot ({exc})") from None
    try:  # what Veil will read of it: no reserved member in any form it takes (a defined form's keys)
        routed = parse_publication(body)
    except ProtocolError as exc:
        raise ValueError(f"{exc.field}: {exc.problem}") from None
    if routed.reserved is not None or routed.key is not None:
        raise ValueError(f"the payload sets members named {PREFIX}*, which are Veil's, not a device's")
    return body


def permanent(error: VeilError) -> bool:
    """Whether Veil refused the publication itself (it would refuse it again) rather than the bridge
    (its credential) or for now."""
    return error.status in (400, 403, 413) and error.field not in CREDENTIAL


class Inbound:
    def __init__(
        self,
        link: MqttLink,
        client: VeilClient,
        templates: list[TopicTemplate],
        journal: Journal,
        value_attribute: str = "value",
    ) -> None:
        self.link, self.client, self.templates, self.journal = link, client, templates, journal
        self.value_attribute = value_attribute
        self.counts = Counts()
        # packet ids this process wrote to the journal and has not acknowledged on the connection they
        # came on: their entries are kept when copies of them go stale, since they may be in Veil
        self._written: set[int] = set()

    async def run(self) -> None:
        queue = self.link.messages
        while True:
            group = [await queue.get()]
            size = len(group[0].payload)
            while len(group) < GROUP and size < GROUP_BYTES and not queue.empty():
                group.append(queue.get_nowait())
                size += len(group[-1].payload)
            self.link.taken(group)
            await self.forward(group)

    async def forward(self, group: list[Received]) -> None:
        """Publish a group and acknowledge it, in the order it came (as MQTT asks of PUBACKs)."""
        connection = self.link.connection
        if self.link.resumed(connection):  # the older connections' copies come again: those are taken then
            current = [m for m in group if m.connection == connection]
            stale = [m.mid for m in group if m.connection != connection and m.qos > 0 and m.mid not in self._written]
            if stale:
                await asyncio.to_thread(self.journal.forget, stale)
            self.counts.stale += len(group) - len(current)
        else:  # the MQTT broker lost the session: nothing comes again, so the copies go now
            current = group
        self.counts.received += len(current)
        readable: list[tuple[Received, bytes]] = []
        for message in current:
            try:
                readable.append((message, document(self.templates, message.topic, message.payload,
                                                   self.value_attribute)))  # fmt: skip
            except ValueError as exc:
                self._reject(message, str(exc))
        batch = uuid.uuid4().hex
        entries = [Entry(m.mid, digest(m.topic, m.payload), m.dup) for m, _ in readable]
        # a group's line N is keyed batch#N by Veil, N counted from 1 (blank lines count)
        lines = [f"{batch}#{n}" for n in range(1, len(readable) + 1)]
        keys = await asyncio.to_thread(self.journal.keys, entries, lines)
        self._written.update(m.mid for m, _ in readable if m.qos > 0)
        fresh: list[tuple[int, Received, bytes]] = []
        for n, ((message, body), (key, again)) in enumerate(zip(readable, keys, strict=True), start=1):
            if not again:
                fresh.append((n, message, body))
                continue
            # a redelivery after a reconnect: alone, under the key it had (it came before the rest)
            self.counts.repeated += 1
            log.info("MQTT message %d on %s came again: published under its key %s", message.mid, shown(message.topic),
                     key)  # fmt: skip
            await self._one(message, body, key)
        if len(fresh) == 1:
            n, message, body = fresh[0]
            await self._one(message, body, f"{batch}#{n}")
        elif fresh:
            await self._group(batch, fresh)
        for message in current:
            if self.link.ack(message):
                self._written.discard(message.mid)

    async def _group(self, batch: str, lines: list[tuple[int, Received, bytes]]) -> None:
        """Publish as one request, line N keyed `batch#N` as the journal has it: the group's lines,
        with those published alone left blank."""
        numbered = {n: body for n, _, body in lines}
        body = b"\n".join(numbered.get(n, b"") for n in range(1, max(numbered) + 1))
        try:
            await self._persist(
                lambda: self.client.request("/publish", body, "application/x-ndjson", {"Idempotency-Key": batch})
            )
        except VeilError:  # one of them is refused: each alone, under its line's key, finds which
            for n, message, one in lines:
                await self._one(message, one, f"{batch}#{n}")
            return
        self.counts.published += len(lines)

    async def _one(self, message: Received, body: bytes, key: str) -> None:
        try:
            await self._persist(
                lambda: self.client.request("/publish", body, "application/json", {"Idempotency-Key": key})
            )
        except VeilError as exc:
            self._reject(message, str(exc))
            return
        self.counts.published += 1

    async def _persist(self, attempt: Callable[[], Awaitable[Any]]) -> None:
        """Make the attempt until Veil answers 200 (returns) or refuses the publication (raises)."""
        wait = RETRY_FIRST
        while True:
            pause = wait
            try:
                await attempt()
                return
            except VeilError as exc:
                if permanent(exc):
                    raise
                if isinstance(exc, Overloaded) and exc.retry_after is not None:
                    pause = max(pause, exc.retry_after)
                log.warning("Veil did not take the publication (%s); trying again in %.1f s", exc, pause)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:  # ValueError: a garbled 200
                log.warning("Veil unreachable (%s); trying again in %.1f s", exc or type(exc).__name__, pause)
            await asyncio.sleep(pause)
            wait = min(2 * wait, RETRY_MOST)

    def _reject(self, message: Received, why: str) -> None:
        """A message that would be refused again: logged, and acknowledged with the rest of its group."""
        self.counts.rejected += 1
        log.warning("MQTT message on %s not published (acknowledged and dropped): %s", shown(message.topic), why)
