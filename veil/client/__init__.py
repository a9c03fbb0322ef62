"""Python client library (asyncio): publish, subscribe, receive deliveries; the edge broker."""

from veil.client import errors
from veil.client.client import Delivery, DeliveryStream, MultiplexedStream, VeilClient
from veil.client.edge import EdgeBroker
from veil.client.errors import Overloaded, TamperedPublication, VeilError

__all__ = [
    "Delivery", "DeliveryStream", "EdgeBroker", "MultiplexedStream", "Overloaded", "TamperedPublication",
    "VeilClient", "VeilError", "errors",
]  # fmt: skip
