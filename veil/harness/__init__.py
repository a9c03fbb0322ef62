"""Real components started as child processes on free loopback ports, for the integration tests and
the benchmarks: a broker (`broker`), a throwaway PostgreSQL server (`postgres`), a Spark
standalone cluster (`spark`) and a Mosquitto MQTT broker (`mosquitto`)."""

from veil.harness.broker import OPEN_REGISTRY, BrokerProcess, free_ports
from veil.harness.mosquitto import MosquittoServer
from veil.harness.postgres import PostgresServer, postgres_database
from veil.harness.spark import SparkCluster

__all__ = [
    "OPEN_REGISTRY",
    "BrokerProcess",
    "MosquittoServer",
    "PostgresServer",
    "SparkCluster",
    "free_ports",
    "postgres_database",
]
