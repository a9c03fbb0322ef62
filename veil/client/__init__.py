"""Python client library (asyncio) and command-line interface."""

from veil.client.client import Delivery, DeliveryStream, TamperedPublication, VeilClient, VeilError
from veil.client.edge import EdgeBroker

__all__ = ["Delivery", "DeliveryStream", "EdgeBroker", "TamperedPublication", "VeilClient", "VeilError"]
