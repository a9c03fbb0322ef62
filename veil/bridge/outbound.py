"""Veil → MQTT: a subscription's deliveries published to an MQTT topic (QoS 1), each taken from Veil
only once the MQTT broker acknowledged the one before it.

The delivery stream acknowledges to Veil what the bridge has consumed, and a delivery counts as
consumed when the next one is asked for, after its MQTT publish was acknowledged: a bridge that dies
resumes at the first delivery the MQTT broker may not have, so nothing is lost; one that died between
the two acknowledgements publishes that delivery again (MQTT's QoS 1 is at least once). A delivery
whose topic cannot be made (`TopicTemplate.render`) is logged and skipped: a publisher's attributes
must not stop the subscription for everyone after it.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from veil.bridge.mqtt_link import MqttLink, PublishRefused
from veil.bridge.topics import TopicMismatch, TopicTemplate, shown
from veil.client import VeilClient

log = logging.getLogger("veil.bridge")

RETRY_FIRST, RETRY_MOST = 0.5, 8.0  # seconds between attempts at an MQTT publish that failed


class Outbound:
    def __init__(self, link: MqttLink, client: VeilClient, subscription_id: str, template: TopicTemplate) -> None:
        self.link, self.client, self.subscription_id = link, client, subscription_id
        self.template = template.check_outbound()
        self.published = self.skipped = 0

    async def run(self) -> None:
        async with self.client.deliveries(self.subscription_id, consumed_on_next=True) as stream:
            log.info("delivering subscription %s to MQTT topic %r", self.subscription_id, self.template.text)
            async for delivery in stream:
                try:
                    topic = self.template.render(delivery.publication)
                except TopicMismatch as exc:
                    self.skipped += 1
                    log.warning("delivery %s of subscription %s skipped: %s", delivery.seq, self.subscription_id, exc)
                    continue
                await self._publish(topic, orjson.dumps(delivery.publication))

    async def _publish(self, topic: str, payload: bytes) -> None:
        """Publish until the MQTT broker takes it, or refuses this message for good (logged, skipped:
        it would be refused again)."""
        wait = RETRY_FIRST
        while True:
            try:
                await self.link.publish(topic, payload)
                self.published += 1
                return
            except PublishRefused as exc:
                if not exc.retry:
                    self.skipped += 1
                    log.error("MQTT broker refused a delivery of %s to %s: %s (skipped)", self.subscription_id,
                              shown(topic), exc)  # fmt: skip
                    return
                log.warning("MQTT broker refused a delivery for now (%s); trying again in %.1f s", exc, wait)
            except (ConnectionError, ValueError) as exc:
                log.warning("MQTT publish failed (%s); trying again in %.1f s", exc, wait)
            await asyncio.sleep(wait)
            wait = min(2 * wait, RETRY_MOST)
