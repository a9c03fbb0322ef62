"""`veil bridge mqtt`: one MQTT session carrying templates' topics into Veil and subscriptions'
deliveries out to MQTT topics, as a client of Veil like any other (its identity is its credential)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from veil.bridge.inbound import Inbound
from veil.bridge.journal import Journal
from veil.bridge.mqtt_link import MqttLink
from veil.bridge.outbound import Outbound
from veil.bridge.topics import TopicTemplate
from veil.client import VeilClient
from veil.client.errors import FATAL, Quarantined, VeilError

log = logging.getLogger("veil.bridge")

RETRY_FIRST, RETRY_MOST = 1.0, 30.0  # seconds before a subscription's delivery is tried again


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
        """Until cancelled, or until no part is left running: a subscription refused for good
        (removed, not the bridge's) ends its part alone, logged, and is raised once nothing runs."""
        journal = Journal(self.journal_path)
        ca, cert, key = self.tls_files
        filters = [t.filter for t in self.topics]
        inbound: Inbound | None = None
        outbound: list[Outbound] = []
        failures: list[VeilError] = []

        async def delivering(out: Outbound) -> None:
            """A subscription refused for good (removed, not the bridge's, quarantined) stops here
            alone; anything else (Veil unreachable long enough for the stream to give up) is tried
            again, backing off."""
            wait = RETRY_FIRST
            while True:
                try:
                    await out.run()
                except (*FATAL, Quarantined) as exc:
                    log.error("subscription %s is not delivered to MQTT: %s", out.subscription_id, exc)
                    failures.append(exc)
                    return
                except Exception as exc:  # whatever it was, the other parts go on
                    log.warning("delivering subscription %s failed (%s); again in %.0f s", out.subscription_id,
                                exc, wait)  # fmt: skip
                await asyncio.sleep(wait)
                wait = min(2 * wait, RETRY_MOST)

        try:
            async with MqttLink(
                self.mqtt_url, self.client_id, filters, ca_file=ca, cert_file=cert, key_file=key
            ) as link:
                inbound = Inbound(link, self.client, self.topics, journal, self.value_attribute)
                outbound = [Outbound(link, self.client, subscription, topic) for subscription, topic in self.deliver]
                async with asyncio.TaskGroup() as tasks:
                    if self.topics:
                        tasks.create_task(inbound.run())
                    for out in outbound:
                        tasks.create_task(delivering(out))
        finally:
            journal.close()
            if inbound is not None:
                c = inbound.counts
                log.info(
                    "stopped: %d MQTT messages received, %d published into Veil (%d again after a reconnect), "
                    "%d rejected, %d stale copies left to come again", c.received, c.published, c.repeated,
                    c.rejected, c.stale,
                )  # fmt: skip
                for out in outbound:
                    log.info("subscription %s: %d deliveries published to MQTT, %d skipped", out.subscription_id,
                             out.published, out.skipped)  # fmt: skip
        if failures:
            raise failures[0]
