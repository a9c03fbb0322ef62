"""The Spark Structured Streaming job: source → partition → match → exit point."""
