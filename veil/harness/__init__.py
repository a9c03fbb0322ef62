"""Real components started as child processes on free loopback ports, for the integration tests and
the benchmarks: a broker (`broker`) and a throwaway PostgreSQL server (`postgres`)."""

from veil.harness.broker import OPEN_REGISTRY, BrokerProcess, free_ports
from veil.harness.postgres import PostgresServer, postgres_database

__all__ = ["OPEN_REGISTRY", "BrokerProcess", "PostgresServer", "free_ports", "postgres_database"]
