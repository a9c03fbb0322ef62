"""The asyncio gateway: REST, TCP line and WebSocket delivery. Knows nothing about Spark."""
