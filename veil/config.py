"""One typed configuration: command-line flags > environment variables > config file > defaults.

Names follow the SELIS configuration table (SPEC §10) where it has one, with its environment
variables (PORT, HOSTNAME, CERTIFICATE, PRIVATE_KEY, ...) next to VEIL_-prefixed ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import re
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from veil.protocol.limits import DAY_MS, Limits
from veil.security.endpoints import Network, networks
from veil.security.identity import METHODS as AUTH_METHODS

log = logging.getLogger("veil.config")
LOG_LEVELS = ("debug", "info", "warning", "error")
TASK_ATTEMPTS = 4  # attempts of a failed Spark task in local mode, as spark.task.maxFailures on a cluster


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def _opt(default: Any, help: str, env: tuple[str, ...] = (), kind: Any = None, shown: str | None = None) -> Any:
    """An option; `shown` is its default as help and the README's tables say it, where that is not the
    value itself (a default derived from other options)."""
    return field(default=default, metadata={"help": help, "env": env, "kind": kind, "shown": shown})


@dataclass
class Config:
    hostname: str = _opt("localhost", "host name advertised to subscribers", ("VEIL_HOSTNAME", "HOSTNAME"))
    bind: str = _opt("127.0.0.1", "address the listeners bind to", ("VEIL_BIND",))
    port: int = _opt(20000, "REST port", ("VEIL_PORT", "PORT"))
    tcp_port: int | None = _opt(None, "TCP line delivery port", ("VEIL_TCP_PORT",), int, "port+1")
    ws_port: int | None = _opt(None, "WebSocket delivery port (path /)", ("VEIL_WS_PORT",), int, "port+2")
    certificate: str | None = _opt(
        None, "PEM server certificate: enables TLS", ("VEIL_CERTIFICATE", "CERTIFICATE"), str
    )
    private_key: str | None = _opt(None, "PEM private key of the certificate", ("VEIL_PRIVATE_KEY", "PRIVATE_KEY"), str)
    client_ca: str | None = _opt(
        None, "CA bundle that signs client certificates (mutual TLS)", ("VEIL_CLIENT_CA",), str
    )
    client_cert: str = _opt(
        "optional", "client certificates: optional or required (with client-ca)", ("VEIL_CLIENT_CERT",)
    )
    crl: str | None = _opt(
        None, "certificate revocation list (PEM or DER) of client certificates, signed by a client-ca CA; read "
        "again whenever the file changes",
        ("VEIL_CRL",), str,
    )  # fmt: skip
    allow_plain_remote: bool = _opt(
        False, "allow plain (non-TLS) listeners on non-loopback addresses", ("VEIL_ALLOW_PLAIN_REMOTE",)
    )
    data_dir: str = _opt("veil-data", "directory of the embedded store and Spark checkpoints", ("VEIL_DATA_DIR",))
    store: str | None = _opt(
        None, "store URL: sqlite:///PATH, or postgresql://user@host/db for a deployment on several machines",
        ("VEIL_STORE",), str, "sqlite:///<data-dir>/veil.db",
    )  # fmt: skip
    spark_master: str | None = _opt(
        None, "Spark master: local[N,F] runs Spark in this process pair, N the larger of --workers and "
        "--partitions, a failed task tried F times in all (local[N] never retries one); spark://host:7077 a "
        "standalone cluster (needs the PostgreSQL store)",
        ("VEIL_SPARK_MASTER", "SPARK_MASTER"), str, "local[N,4]",
    )  # fmt: skip
    workers: int | None = _opt(
        None,
        "Spark task threads in local mode (at least one per matcher partition)",
        ("VEIL_WORKERS", "WORKERS"),
        int,
        "cores",
    )
    driver_memory: str = _opt(
        "4g", "Spark driver heap (in local mode also the executors', where matcher partitions hold their state)",
        ("VEIL_DRIVER_MEMORY",),
    )  # fmt: skip
    python_memory: str | None = _opt(
        None, "most memory of each Spark Python worker (spark.executor.pyspark.memory), where matcher "
        "partitions keep their state; a worker past it fails its task, which Spark retries",
        ("VEIL_PYTHON_MEMORY",), str, "unbounded",
    )  # fmt: skip
    partitions: int = _opt(2, "matcher partitions (fixed per deployment)", ("VEIL_PARTITIONS",))
    partition_mode: str = _opt(
        "subscriptions",
        "subscriptions: each partition holds 1/N of them (scales their number); "
        "publications: each holds all and matches 1/N of the publications (scales the rate)",
        ("VEIL_PARTITION_MODE",),
    )
    trigger: str = _opt(
        "rounds", "rounds: a long-running Spark task per matcher partition follows the log and records a round "
        "per commit (tens of ms); micro-batch: Spark plans each range of the log as a micro-batch, matches it "
        "in mapInArrow and records it in foreachBatch (Spark's fixed cost per batch, ~0.3 s here)",
        ("VEIL_TRIGGER",),
    )  # fmt: skip
    epoch_seconds: float = _opt(
        300.0, "rounds: seconds a matcher task follows the log before Spark checkpoints and starts the next "
        "(between two, publications wait for the next tasks to start)",
        ("VEIL_EPOCH_SECONDS",),
    )  # fmt: skip
    max_batch_rows: int = _opt(50000, "most log entries per matching round", ("VEIL_MAX_BATCH_ROWS",))
    round_gap_ms: int = _opt(
        100, "least milliseconds between the starts of a matcher partition's rounds while publications come "
        "fast (its rounds took in 500 log entries a second or more over the last second; slower, a round starts "
        "at once; longer after a round that reached over 1,000 subscriptions): rounds carry more, for fewer "
        "writes downstream; with --trigger micro-batch, the least time between the starts of micro-batches",
        ("VEIL_ROUND_GAP_MS",),
    )  # fmt: skip
    max_batch_matches: int = _opt(
        2_000_000,
        "about the most matches per matching round (a matcher holds them until they are recorded): rounds "
        "shrink by the matches per entry seen last",
        ("VEIL_MAX_BATCH_MATCHES",),
    )
    role: str = _opt(
        "all", "all: gateway and pipeline in one; gateway: REST and delivery only (any number share one "
        "store); pipeline: the Spark driver only (one per store)",
        ("VEIL_ROLE",),
    )  # fmt: skip
    gateway_id: str | None = _opt(
        None, "this gateway's name among those sharing the store", ("VEIL_GATEWAY_ID",), str, "host:port",
    )  # fmt: skip
    checkpoint: str | None = _opt(
        None, "Spark checkpoint location: a path or a Hadoop-compatible URL", ("VEIL_CHECKPOINT",), str,
        "<data-dir>/checkpoint",
    )  # fmt: skip
    class_cache: str = _opt(
        "", "directory where the pipeline keeps Spark's classes archived for its JVM (class-data "
        "sharing: a start seconds sooner); off: none", ("VEIL_CLASS_CACHE",), str, "~/.cache/veil",
    )  # fmt: skip
    spark_conf: tuple[str, ...] = _opt(
        (), "a Spark setting KEY=VALUE for the pipeline, e.g. spark.executor.memory=2g (repeatable; "
        "VEIL_SPARK_CONF: one per line)",
        ("VEIL_SPARK_CONF",), tuple,
    )  # fmt: skip
    instances: int = _opt(
        1, "SELIS instances: only 1 (several gateways share a store instead: see --role)",
        ("VEIL_INSTANCES", "INSTANCES"),
    )  # fmt: skip
    instance_id: int = _opt(0, "SELIS instance id: only 0", ("VEIL_INSTANCE_ID", "INSTANCEID"))
    metrics_auth_hash_file: str | None = _opt(
        None, "file with the monitoring authHash", ("VEIL_METRICS_AUTH_HASH_FILE", "METRICSAUTHHASHFILE"), str
    )
    metrics_interval: float = _opt(
        5.0, "seconds between monitoring messages (>= 1)", ("VEIL_METRICS_INTERVAL", "METRICSINTERVAL")
    )
    with_authorization: bool = _opt(
        True, "deliver only what an authorization rule allows", ("VEIL_WITH_AUTHORIZATION", "WITH_AUTHORIZATION")
    )
    registry: str | None = _opt(
        None, "registry file (YAML or JSON) applied at start: users, groups, rules, policies, cropping, keys",
        ("VEIL_REGISTRY",), str,
    )  # fmt: skip
    auth: str = _opt(
        "certificate,token,hash",
        "accepted proofs of identity: certificate, token, hash (static hashes the registry lists), "
        "any-hash (any claimed authHash; development only)",
        ("VEIL_AUTH",),
    )
    anonymous: bool = _opt(False, "let clients without credentials in, as anonymous", ("VEIL_ANONYMOUS",))
    dev: bool = _opt(
        False, "development profile, the SELIS server's behaviour: any claimed authHash is an identity, anonymous "
        "clients are let in, and everyone receives everything (explicit options still win); never in production",
        ("VEIL_DEV",),
    )  # fmt: skip
    jwks: str | None = _opt(
        None, "identity provider's public keys for bearer tokens: JWKS file or URL", ("VEIL_JWKS",), str
    )
    token_issuer: str | None = _opt(None, "required issuer (iss) of bearer tokens", ("VEIL_TOKEN_ISSUER",), str)
    token_audience: str | None = _opt(None, "required audience (aud) of bearer tokens", ("VEIL_TOKEN_AUDIENCE",), str)
    max_body: int = _opt(1 << 20, "largest accepted request body in bytes", ("VEIL_MAX_BODY",))
    max_registry: int = _opt(
        1 << 20, "largest registry in bytes that changes through the API may make (each change stores a whole "
        "copy, which every gateway and the pipeline parse)",
        ("VEIL_MAX_REGISTRY",),
    )  # fmt: skip
    max_publisher_rules: int = _opt(
        64 * 1024, "largest policies and cropping rules in bytes one publisher may set (/publisher/rules)",
        ("VEIL_MAX_PUBLISHER_RULES",),
    )  # fmt: skip
    max_lag: int = _opt(200000, "log entries the pipeline may lag behind before publishes get 503", ("VEIL_MAX_LAG",))
    max_pending: int = _opt(
        20000, "publications waiting for a commit before publishes get 503 (also the largest batch)",
        ("VEIL_MAX_PENDING",),
    )  # fmt: skip
    max_depth: int = _opt(32, "deepest nesting of objects and arrays in a request", ("VEIL_MAX_DEPTH",))
    max_keys: int = _opt(10_000, "most attributes of a publication, nested ones counted", ("VEIL_MAX_KEYS",))
    max_key_length: int = _opt(1024, "longest key of a JSON object, in characters", ("VEIL_MAX_KEY_LENGTH",))
    max_constraints: int = _opt(1024, "most constraints of a subscription or announcement", ("VEIL_MAX_CONSTRAINTS",))
    max_in_values: int = _opt(10_000, "most values of an `in` constraint", ("VEIL_MAX_IN_VALUES",))
    max_k: int = _opt(10_000, "largest k of a top-k/w subscription", ("VEIL_MAX_K",))
    max_window_ms: int = _opt(DAY_MS * 30, "longest top-k/w window, in milliseconds", ("VEIL_MAX_WINDOW_MS",))
    max_window_count: int = _opt(
        10_000, "largest n of a top-k of the last n publications (an arrival may cost O(n))",
        ("VEIL_MAX_WINDOW_COUNT",),
    )  # fmt: skip
    max_validity_ms: int = _opt(DAY_MS * 30, "longest X-Valid-For, in milliseconds", ("VEIL_MAX_VALIDITY_MS",))
    idempotency_window: float = _opt(
        120.0, "seconds a publisher's idempotency key is remembered: a publish repeated with it meanwhile is "
        "answered with the first publication's id and logged once",
        ("VEIL_IDEMPOTENCY_WINDOW",),
    )  # fmt: skip
    retention: float = _opt(
        0.0, "seconds the log keeps publications after they are logged, for subscriptions that ask for what "
        "matched since a time (\"since\" in /subscribe); 0: only as long as a queue or the pipeline needs them",
        ("VEIL_RETENTION",),
    )  # fmt: skip
    max_queued_deliveries: int = _opt(
        1_000_000, "most deliveries a subscription's queue holds (a subscriber may ask for fewer): the oldest past it "
        "go to its dead letters", ("VEIL_MAX_QUEUED_DELIVERIES",),
    )  # fmt: skip
    max_queued_bytes: int = _opt(
        1 << 30, "most bytes of publications a subscription's queue holds (a subscriber may ask for fewer)",
        ("VEIL_MAX_QUEUED_BYTES",),
    )  # fmt: skip
    max_queued_age: float = _opt(
        7 * 86400.0, "seconds a delivery stays queued after its publication (a subscriber may ask for less)",
        ("VEIL_MAX_QUEUED_AGE",),
    )  # fmt: skip
    ack_wait: float = _opt(
        60.0, "seconds a member of a subscription's group may hold deliveries without acknowledging any: then it "
        "is closed, and they go to the other members", ("VEIL_ACK_WAIT",),
    )  # fmt: skip
    cors_origin: tuple[str, ...] = _opt(
        (), "an origin (https://app.example.com) whose browser pages may call the REST API, or * for any; repeat "
        "for more (without one, browsers keep other sites' pages from reading its answers)",
        ("VEIL_CORS_ORIGIN",), tuple,
    )  # fmt: skip
    webhook_allow: tuple[str, ...] = _opt(
        (), "network (CIDR) webhook endpoints may be in besides public addresses, e.g. 10.0.0.0/8; repeat for "
        "more (loopback, link-local and private addresses are refused otherwise)", ("VEIL_WEBHOOK_ALLOW",), tuple,
    )  # fmt: skip
    webhook_ca: str | None = _opt(
        None, "PEM CA bundle trusted for webhook endpoints' certificates besides the system's", ("VEIL_WEBHOOK_CA",),
        str,
    )  # fmt: skip
    webhook_timeout: float = _opt(
        10.0, "seconds a webhook request may take, connecting included, before it counts as failed",
        ("VEIL_WEBHOOK_TIMEOUT",),
    )  # fmt: skip
    webhook_attempts: int = _opt(
        10, "attempts at delivering a webhook request before its deliveries go to the subscription's dead letters",
        ("VEIL_WEBHOOK_ATTEMPTS",),
    )  # fmt: skip
    webhook_backoff: float = _opt(
        1.0, "seconds before a failed webhook request's first retry; each next one waits twice as long, at most "
        "300 s", ("VEIL_WEBHOOK_BACKOFF",),
    )  # fmt: skip
    max_replay: int = _opt(
        1_000_000, "most log entries a subscription's replay (\"since\") may read: an earlier since is refused",
        ("VEIL_MAX_REPLAY",),
    )  # fmt: skip
    read_timeout: float = _opt(
        10.0, "seconds a client may take to send a request (or a WebSocket upgrade) once connected",
        ("VEIL_READ_TIMEOUT",),
    )  # fmt: skip
    max_unauthenticated: int = _opt(
        2000, "connections that have not yet sent a request or handshake, or idle between requests; beyond "
        "it the oldest go",
        ("VEIL_MAX_UNAUTHENTICATED",),
    )  # fmt: skip
    max_client_subscriptions: int = _opt(
        100_000, "most live subscriptions of one client (identity); beyond it /subscribe gets 429",
        ("VEIL_MAX_CLIENT_SUBSCRIPTIONS",),
    )  # fmt: skip
    max_client_webhooks: int = _opt(
        1000, "most live webhook subscriptions of one client (identity), each delivered by a gateway all the time; "
        "beyond it /subscribe gets 429", ("VEIL_MAX_CLIENT_WEBHOOKS",),
    )  # fmt: skip
    max_client_connections: int = _opt(
        1024, "most delivery connections one client (identity) keeps open at a gateway; beyond it the handshake "
        "gets an error line (429)",
        ("VEIL_MAX_CLIENT_CONNECTIONS",),
    )  # fmt: skip
    max_client_queued: int = _opt(
        32 << 20, "bytes of delivery lines a gateway queues in memory for one client's connections; beyond it "
        "they wait in the store until the client reads what was queued",
        ("VEIL_MAX_CLIENT_QUEUED",),
    )  # fmt: skip
    max_queued: int = _opt(
        512 << 20, "bytes of delivery lines a gateway queues in memory for all its connections together; "
        "beyond it they wait in the store",
        ("VEIL_MAX_QUEUED",),
    )  # fmt: skip
    entry_timeout: float = _opt(
        60.0, "seconds the pipeline may spend on one log entry before setting it aside (quarantine)",
        ("VEIL_ENTRY_TIMEOUT",),
    )  # fmt: skip
    stall_timeout: float = _opt(
        300.0, "seconds a matcher partition may go without a sign of life before /health calls the pipeline stuck",
        ("VEIL_STALL_TIMEOUT",),
    )  # fmt: skip
    log_level: str = _opt(
        "info", "least level of the log lines written to standard error: debug, info, warning or error",
        ("VEIL_LOG_LEVEL",),
    )  # fmt: skip

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{os.path.abspath(os.path.join(self.data_dir, 'veil.db'))}"

    @property
    def checkpoint_location(self) -> str:
        return self.checkpoint or os.path.join(os.path.abspath(self.data_dir), "checkpoint")

    @property
    def gateway_name(self) -> str:
        return self.gateway_id or f"{socket.gethostname()}:{self.port}"

    @property
    def webhook_networks(self) -> tuple[Network, ...]:
        return networks(self.webhook_allow, "--webhook-allow")

    @property
    def class_cache_dir(self) -> str | None:
        if self.class_cache == "off":
            return None
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.abspath(os.path.expanduser(self.class_cache or os.path.join(cache, "veil")))

    @property
    def spark_settings(self) -> dict[str, str]:
        return dict(setting.split("=", 1) for setting in self.spark_conf)

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_depth, self.max_keys, self.max_key_length, self.max_constraints, self.max_in_values,
            self.max_k, self.max_window_ms, self.max_validity_ms, self.max_window_count,
        )  # fmt: skip

    @property
    def tcp(self) -> int:
        return self.tcp_port if self.tcp_port is not None else self.port + 1

    @property
    def ws(self) -> int:
        return self.ws_port if self.ws_port is not None else self.port + 2

    @property
    def tls(self) -> bool:
        return self.certificate is not None

    @property
    def auth_methods(self) -> frozenset[str]:
        return frozenset(m.strip() for m in self.auth.split(",") if m.strip())

    @property
    def master(self) -> str:
        """Each matcher partition's task runs all the time, so local mode gets a task thread for each
        (with fewer cores, a task runs several partitions). A matcher task whose Python worker died
        is retried (Spark's default of 4 attempts), not the query aborted."""
        threads = max(self.workers or os.cpu_count() or 1, self.partitions)
        return self.spark_master or f"local[{threads},{TASK_ATTEMPTS}]"

    def validate(self) -> None:
        """Refuse inconsistent settings before anything starts; messages name the option."""
        for name in ("port", "tcp_port", "ws_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 65536:
                raise ValueError(f"--{_flag(name)}: {value} is not a port number")
        if (self.certificate is None) != (self.private_key is None):
            raise ValueError("--certificate and --private-key go together")
        for name in ("certificate", "private_key", "client_ca", "metrics_auth_hash_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"--{_flag(name)}: no such file {path!r}")
        if self.client_ca and not self.tls:
            raise ValueError("--client-ca needs --certificate (mutual TLS is TLS)")
        if self.crl is not None and not self.client_ca:
            raise ValueError("--crl needs --client-ca (it lists revoked client certificates)")
        if self.crl is not None and not os.path.isfile(self.crl):
            raise ValueError(f"--crl: no such file {self.crl!r}")
        if self.client_cert not in ("optional", "required"):
            raise ValueError("--client-cert: use optional or required")
        if self.client_cert == "required" and not self.client_ca:
            raise ValueError("--client-cert required needs --client-ca")
        if not self.tls and not self.allow_plain_remote and not _loopback(self.bind):
            raise ValueError(
                f"--bind {self.bind}: plain listeners only on loopback; configure --certificate or --allow-plain-remote"
            )
        for name in ("driver_memory", "python_memory"):
            size = getattr(self, name)
            if size is not None and not re.fullmatch(r"[1-9][0-9]*[kmgt]?", size.lower()):
                raise ValueError(f"--{_flag(name)}: {size!r} is not a size like 4g or 512m")
        if self.partitions < 1:
            raise ValueError("--partitions: at least 1")
        if self.partition_mode not in ("subscriptions", "publications"):
            raise ValueError("--partition-mode: subscriptions or publications")
        if self.trigger not in ("rounds", "micro-batch"):
            raise ValueError(f"--trigger: {self.trigger!r} is neither rounds nor micro-batch")
        if self.instances != 1 or self.instance_id != 0:
            raise ValueError(
                "--instances/--instance-id: Veil runs as one instance per store; to spread the load, run "
                "several `veil serve --role gateway` on one store (any gateway serves any client) and one "
                "`veil serve --role pipeline` on a Spark cluster"
            )
        if self.role not in ("all", "gateway", "pipeline"):
            raise ValueError(f"--role: {self.role!r}; use all, gateway or pipeline")
        if not self.master.startswith("local") and not self.store_url.startswith(("postgresql:", "postgres:")):
            raise ValueError(
                f"--spark-master {self.master}: executors on other machines cannot share the SQLite store "
                "(a file of this machine, written with shared memory): use --store postgresql://..."
            )
        for setting in self.spark_conf:
            if not re.fullmatch(r"spark\.[\w.\-]+=.*", setting, re.S):
                raise ValueError(f"--spark-conf: {setting!r} is not KEY=VALUE with a spark.* key")
        if self.metrics_interval < 1:
            raise ValueError("--metrics-interval: at least 1 second")
        unknown = sorted(set(self.auth_methods) - set(AUTH_METHODS))
        if unknown or not self.auth_methods:
            raise ValueError(f"--auth: {', '.join(unknown) or 'empty'}; use some of {', '.join(AUTH_METHODS)}")
        if self.registry is not None and not os.path.isfile(self.registry):
            raise ValueError(f"--registry: no such file {self.registry!r}")
        if min(self.max_batch_rows, self.max_batch_matches, self.max_body) < 1:
            raise ValueError("--max-batch-rows, --max-batch-matches and --max-body must be positive")
        if min(self.max_registry, self.max_publisher_rules) < 1:
            raise ValueError("--max-registry and --max-publisher-rules must be positive")
        # at least as long as a client's retries last (the client library's: 30 s), or a retry that
        # comes after its key is forgotten publishes again
        if not 60 <= self.idempotency_window <= 7 * 86400:
            raise ValueError("--idempotency-window: seconds, from 60 to 604800 (a week)")
        if min(self.max_queued_deliveries, self.max_queued_bytes) < 1 or self.max_queued_age < 1:
            raise ValueError("--max-queued-deliveries, --max-queued-bytes and --max-queued-age (s) must be positive")
        if not 1 <= self.ack_wait <= 86400:
            raise ValueError("--ack-wait: seconds, from 1 to 86400 (a day)")
        networks(self.webhook_allow, "--webhook-allow")
        for origin in self.cors_origin:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"--cors-origin: {origin!r} is not an origin (scheme://host[:port], no path) or *")
        if self.webhook_ca is not None and not os.path.isfile(self.webhook_ca):
            raise ValueError(f"--webhook-ca: no such file {self.webhook_ca!r}")
        if not 0 < self.webhook_timeout <= 300:
            raise ValueError("--webhook-timeout: seconds, more than 0 and at most 300")
        if not 1 <= self.webhook_attempts <= 100:
            raise ValueError("--webhook-attempts: from 1 to 100")
        if not 0 < self.webhook_backoff <= 300:
            raise ValueError("--webhook-backoff: seconds, more than 0 and at most 300")
        if self.max_replay < 1:
            raise ValueError("--max-replay must be positive")
        if not 0 <= self.retention <= 366 * 86400:
            raise ValueError("--retention: seconds, from 0 to 31622400 (366 days)")
        if not 0 <= self.round_gap_ms <= 10_000:
            raise ValueError("--round-gap-ms: from 0 to 10000")
        if not 1 <= self.epoch_seconds <= 3600:
            raise ValueError("--epoch-seconds: from 1 to 3600")
        for option in (
            *(f"max_{name}" for name in Limits._fields), "max_pending", "max_unauthenticated",
            "max_client_subscriptions", "max_client_webhooks", "max_client_connections", "max_client_queued",
            "max_queued",
        ):  # fmt: skip
            if getattr(self, option) < 1:
                raise ValueError(f"--{_flag(option)}: at least 1")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"--log-level: {self.log_level!r}; use {', '.join(LOG_LEVELS)}")
        for name in ("read_timeout", "entry_timeout", "stall_timeout"):
            if not 0 < getattr(self, name) < 86400:
                raise ValueError(f"--{_flag(name)}: seconds, more than 0 and less than a day")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _convert(f: dataclasses.Field, raw: Any, source: str) -> Any:
    kind: Callable[[Any], Any] = f.metadata["kind"] or type(f.default)
    if kind is tuple:  # repeated flags, a TOML array, or lines of an environment variable
        items = raw.splitlines() if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
            raise ValueError(f"{source}: a list of strings")
        return tuple(item.strip() for item in items if item.strip())
    try:
        return _bool(raw) if kind is bool else kind(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


DEV_PROFILE = {"auth": "certificate,token,any-hash", "anonymous": True, "with_authorization": False}


class _Switch(argparse.Action):
    """An on/off option: `--name` turns it on, and `--name true|false` (how SELIS's scripts and
    older command lines write it) still works; `--no-name` (_Off) turns it off."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None):
        setattr(namespace, self.dest, True if values is None else values)


class _Off(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None):
        setattr(namespace, self.dest, False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="TOML configuration file: option names without their dashes, e.g. port = 20000 "
        "(default: none; environment VEIL_CONFIG)",
    )  # fmt: skip
    for f in dataclasses.fields(Config):
        flag = _flag(f.name)
        shown = f"{f.metadata['help']} (default: {f.metadata['shown'] or _shown(f.default)}"
        shown += f"; environment {', '.join(f.metadata['env'])})" if f.metadata["env"] else ")"
        if (f.metadata["kind"] or type(f.default)) is bool:
            parser.add_argument(f"--{flag}", dest=f.name, default=None, action=_Switch, help=shown)
            parser.add_argument(f"--no-{flag}", dest=f.name, default=None, action=_Off, help=f"turns --{flag} off")
            continue
        repeated = "append" if f.metadata["kind"] is tuple else "store"
        parser.add_argument(f"--{flag}", dest=f.name, default=None, action=repeated, help=shown)


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return "none" if default is None or default == () else str(default)


def load(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Config:
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    path = getattr(args, "config", None) or environ.get("VEIL_CONFIG")
    if path:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"--config {path}: {exc}") from None
        known = {f.name: f for f in dataclasses.fields(Config)}
        for key, raw in document.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ValueError(f"--config {path}: unknown option {key!r}")
            values[name] = _convert(known[name], raw, f"{path}: {key}")
    for f in dataclasses.fields(Config):
        for env in f.metadata["env"]:
            if environ.get(env):
                values[f.name] = _convert(f, environ[env], f"environment {env}")
                break
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is not None:
            values[f.name] = _convert(f, raw, f"--{_flag(f.name)}")
    if values.get("dev"):
        for name, value in DEV_PROFILE.items():
            values.setdefault(name, value)
        asked = values.get("bind")
        if asked is not None and not _loopback(asked):
            # anyone who reaches a --dev broker is whoever they claim to be, an admin included
            log.warning("--dev listens on loopback only: binding 127.0.0.1, not --bind %s", asked)
            values["bind"] = "127.0.0.1"
    config = Config(**values)
    config.validate()
    return config
