"""Python client library (asyncio) and command-line interface."""

from veil.client.client import Delivery, DeliveryStream, TamperedPublication, VeilClient, VeilError

__all__ = ["Delivery", "DeliveryStream", "TamperedPublication", "VeilClient", "VeilError"]
