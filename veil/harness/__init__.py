"""Real components started as child processes on free loopback ports, for the integration tests and
the benchmarks: a broker (`broker`), a throwaway PostgreSQL server (`postgres`) and a Spark
standalone cluster (`spark`)."""

from veil.harness.broker import OPEN_REGISTRY, BrokerProcess, free_ports
from veil.harness.postgres import PostgresServer, postgres_database
from veil.harness.spark import SparkCluster

__all__ = ["OPEN_REGISTRY", "BrokerProcess", "PostgresServer", "SparkCluster", "free_ports", "postgres_database"]
