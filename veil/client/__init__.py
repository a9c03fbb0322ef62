"""Python client library (asyncio): publish, subscribe, receive deliveries; the edge broker."""

from veil.client import errors
from veil.client.client import Delivery, DeliveryStream, MultiplexedStream, VeilClient
from veil.client.edge import EdgeBroker
from veil.client.errors import Overloaded, TamperedPublication, VeilError
from veil.security.webhook_signature import SignatureError
from veil.security.webhook_signature import verify as verify_webhook

__all__ = [
    "Delivery", "DeliveryStream", "EdgeBroker", "MultiplexedStream", "Overloaded", "SignatureError",
    "TamperedPublication", "VeilClient", "VeilError", "errors", "verify_webhook",
]  # fmt: skip
