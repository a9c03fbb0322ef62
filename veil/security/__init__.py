"""TLS material and client identities."""
