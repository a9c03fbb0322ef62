"""Python client library (asyncio) and command-line interface."""

from veil.client.client import Delivery, DeliveryStream, VeilClient, VeilError

__all__ = ["Delivery", "DeliveryStream", "VeilClient", "VeilError"]
