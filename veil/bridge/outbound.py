"""Veil → MQTT: a subscription's deliveries published to an MQTT topic (QoS 1), each taken from Veil
only once the MQTT broker acknowledged the one before it.

The delivery stream acknowledges to Veil what the bridge has consumed, and a delivery counts as
consumed when the next one is asked for, after its MQTT publish was acknowledged: a bridge that dies
resumes at the first delivery the MQTT broker may not have, so nothing is lost; one that died between
the two acknowledgements publishes that delivery again (MQTT's QoS 1 is at least once).
"""

from __future__ import annotations

import logging

import orjson

from veil.bridge.mqtt_link import MqttLink
from veil.bridge.topics import TopicTemplate
from veil.client import VeilClient

log = logging.getLogger("veil.bridge")


class Outbound:
    def __init__(self, link: MqttLink, client: VeilClient, subscription_id: str, template: TopicTemplate) -> None:
        self.link, self.client, self.subscription_id = link, client, subscription_id
        self.template = template.check_outbound()
        self.published = 0

    async def run(self) -> None:
        async with self.client.deliveries(self.subscription_id) as stream:
            log.info("delivering subscription %s to MQTT topic %r", self.subscription_id, self.template.text)
            async for delivery in stream:
                await self.link.publish(self.template.render(delivery.publication), orjson.dumps(delivery.publication))
                self.published += 1
