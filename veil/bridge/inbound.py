"""MQTT → Veil: each message on a template's topics is published into Veil with the topic's levels
as attributes beside its JSON payload's members, and acknowledged to MQTT only after Veil's 200.

Messages are forwarded in the order they came, in groups (what arrived while the last group was
being published, as one NDJSON request): one group at a time, so Veil's log keeps MQTT's order. A
message Veil refuses for what it is (400, 403, 413: malformed, too deep, not allowed for this
bridge's identity), or whose topic or payload the bridge cannot read, is logged and acknowledged
(it would be refused again, and would hold back everything behind it); anything else (Veil down or
overloaded, the bridge's credential refused) is tried again, backing off, while the messages stay
unacknowledged at the MQTT broker.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from veil.bridge.journal import Entry, Journal, digest
from veil.bridge.mqtt_link import MqttLink, Received
from veil.bridge.topics import TopicMismatch, TopicTemplate
from veil.client import VeilClient
from veil.client.errors import BadRequest, Forbidden, VeilError

log = logging.getLogger("veil.bridge")

GROUP = 256  # messages in one publish request at most
RETRY_FIRST, RETRY_MOST = 0.2, 5.0  # seconds between attempts while Veil cannot take a group
REFUSED = (BadRequest, Forbidden)  # the message itself; 413 comes as a plain VeilError, told by status


@dataclass
class Counts:
    received: int = 0
    published: int = 0
    repeated: int = 0  # redeliveries published again under the key they had
    rejected: int = 0
    stale: int = 0  # copies from a connection since replaced, which come again


def document(templates: list[TopicTemplate], topic: str, payload: bytes, value_attribute: str) -> dict[str, Any]:
    """The publication a message makes: its JSON object's members (a JSON value that is no object, or
    UTF-8 text that is no JSON, under `value_attribute`), then the attributes of the first template its
    topic fits, which win over members of the same name: the topic is what the MQTT broker's access
    rules checked, the payload is whatever the device wrote. TopicMismatch or ValueError if unusable."""
    for template in templates:
        try:
            attributes = template.attributes(topic)
            break
        except TopicMismatch:
            continue
    else:
        raise TopicMismatch(f"topic {topic!r} fits no --topic template")
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        try:
            value = payload.decode()
        except UnicodeDecodeError:
            raise ValueError(f"topic {topic!r}: the payload is neither JSON nor UTF-8 text") from None
    members = value if isinstance(value, dict) else {value_attribute: value}
    return {**members, **attributes}


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

    async def run(self) -> None:
        queue = self.link.messages
        while True:
            group = [await queue.get()]
            while len(group) < GROUP and not queue.empty():
                group.append(queue.get_nowait())
            await self.forward(group)

    async def forward(self, group: list[Received]) -> None:
        """Publish a group and acknowledge it, in the order it came (as MQTT asks of PUBACKs)."""
        current = [m for m in group if m.connection == self.link.connection]
        self.counts.stale += len(group) - len(current)
        self.counts.received += len(current)
        readable: list[tuple[Received, bytes]] = []
        for message in current:
            try:
                doc = document(self.templates, message.topic, message.payload, self.value_attribute)
                readable.append((message, orjson.dumps(doc)))
            except (ValueError, TypeError) as exc:
                self._reject(message, str(exc))
        batch = uuid.uuid4().hex
        entries = [Entry(m.mid, digest(m.topic, m.payload), m.dup) for m, _ in readable]
        keys = await asyncio.to_thread(self.journal.keys, entries, [f"{batch}#{n}" for n in range(len(readable))])
        fresh: list[tuple[int, Received, bytes]] = []
        for n, ((message, body), (key, again)) in enumerate(zip(readable, keys, strict=True)):
            if not again:
                fresh.append((n, message, body))
                continue
            # a redelivery after a reconnect: alone, under the key it had (it came before the rest)
            self.counts.repeated += 1
            log.info("MQTT message %d on %r came again: published under its key %s", message.mid, message.topic, key)
            await self._one(message, body, key)
        if len(fresh) == 1:
            n, message, body = fresh[0]
            await self._one(message, body, f"{batch}#{n}")
        elif fresh:
            await self._group(batch, fresh)
        for message in current:
            self.link.ack(message)

    async def _group(self, batch: str, lines: list[tuple[int, Received, bytes]]) -> None:
        """Publish as one request; line n of the group is keyed `batch#n` as the journal has it, so
        the request's lines are the group's with the repeated ones left blank (blank lines count)."""
        numbered = {n: body for n, _, body in lines}
        body = b"\n".join(numbered.get(n, b"") for n in range(max(numbered) + 1))
        try:
            await self._persist(lambda: self.client.request(
                "/publish", body, "application/x-ndjson", {"Idempotency-Key": batch}
            ))  # fmt: skip
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

    async def _persist(self, attempt: Any) -> None:
        """Make the attempt until Veil answers 200 (returns) or refuses what was sent (raises)."""
        wait = RETRY_FIRST
        while True:
            try:
                await attempt()
                return
            except VeilError as exc:
                if isinstance(exc, REFUSED) or exc.status == 413:
                    raise
                log.warning("Veil did not take the publication (%s); trying again in %.1f s", exc, wait)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning("Veil unreachable (%s); trying again in %.1f s", exc or type(exc).__name__, wait)
            await asyncio.sleep(wait)
            wait = min(2 * wait, RETRY_MOST)

    def _reject(self, message: Received, why: str) -> None:
        """A message that would be refused again: logged, and acknowledged with the rest of its group."""
        self.counts.rejected += 1
        log.warning("MQTT message on %r not published (acknowledged and dropped): %s", message.topic, why)
