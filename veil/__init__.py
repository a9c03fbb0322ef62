"""Veil: a privacy-preserving, content-based publish/subscribe broker."""

__version__ = "0.1.0"
