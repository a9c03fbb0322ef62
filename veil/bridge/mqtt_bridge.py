"""`veil bridge mqtt`: one MQTT session carrying templates' topics into Veil and subscriptions'
deliveries out to MQTT topics, as a client of Veil like any other (its identity is its credential)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from veil.bridge.inbound import Inbound
from veil.bridge.journal import Journal
from veil.bridge.mqtt_link import MqttLink
from veil.bridge.outbound import Outbound
from veil.bridge.topics import TopicTemplate
from veil.client import VeilClient

log = logging.getLogger("veil.bridge")


@dataclass
class MqttBridge:
    client: VeilClient
    mqtt_url: str
    client_id: str
    journal_path: str
    topics: list[TopicTemplate] = field(default_factory=list)
    deliver: list[tuple[str, TopicTemplate]] = field(default_factory=list)  # (subscription id, topic)
    value_attribute: str = "value"
    tls_files: tuple[str | None, str | None, str | None] = (None, None, None)  # CA, certificate, key

    async def run(self) -> None:
        """Until cancelled; the counts are logged on the way out."""
        journal = Journal(self.journal_path)
        ca, cert, key = self.tls_files
        filters = [t.filter for t in self.topics]
        inbound: Inbound | None = None
        try:
            async with MqttLink(
                self.mqtt_url, self.client_id, filters, ca_file=ca, cert_file=cert, key_file=key
            ) as link:
                inbound = Inbound(link, self.client, self.topics, journal, self.value_attribute)
                outbound = [Outbound(link, self.client, sub, topic) for sub, topic in self.deliver]
                async with asyncio.TaskGroup() as tasks:
                    if self.topics:
                        tasks.create_task(inbound.run())
                    for out in outbound:
                        tasks.create_task(out.run())
        finally:
            with contextlib.suppress(Exception):
                journal.close()
            if inbound is not None:
                c = inbound.counts
                log.info(
                    "stopped: %d MQTT messages received, %d published into Veil (%d again after a reconnect), "
                    "%d rejected", c.received, c.published, c.repeated, c.rejected,
                )  # fmt: skip
