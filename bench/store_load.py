"""What a run asks of a PostgreSQL store: statements per publication and the write locks' occupancy.

Every write transaction of the store takes the log's advisory lock (`veil.store.postgres.LOG_LOCK`),
the feed's (`FEED_LOCK`) or both: publications the log's, matcher rounds the feed's. However many
gateways and matcher partitions a deployment has, the time each lock is held per publication bounds
the rate one store takes. A sampler thread reads `pg_locks` and `pg_stat_activity` every `interval`
seconds while the run goes: the share of samples in which each lock was held, and how many
connections were waiting for a lock, times the run's length, give each lock's held time and the
time waited for a lock, per publication. `pg_stat_statements` (loaded by the server's
`SETTINGS`, counting statements clients send, not those inside functions) gives the statements —
about the round trips — per publication, and the server's time in each. The sampler reads from the
administrator's database and only the broker's database is counted, so its own statements are not;
the CPU of the server process that samples is told apart (`StoreLoad.sampler_cpu`) for the caller
to leave out (the two short connections that reset and read the statistics are not).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.cpu import cpu_seconds
from veil.store.postgres import FEED_LOCK, LOG_LOCK

SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}

_SAMPLE = """
SELECT
    count(*) FILTER (WHERE l.objid = %(log)s::bigint::oid),
    count(*) FILTER (WHERE l.objid = %(feed)s::bigint::oid),
    (SELECT count(*) FROM pg_stat_activity WHERE datname = %(db)s AND wait_event_type = 'Lock')
FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE d.datname = %(db)s AND l.locktype = 'advisory' AND l.granted AND l.classid = 0
"""
_STATEMENTS = """
SELECT s.calls, s.total_exec_time, s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = %s ORDER BY s.total_exec_time DESC
"""
TOP = 8  # statements named, those the server spent the most time in


@dataclass
class StoreLoad:
    statements: int  # sent by the broker's processes while sampled
    seconds: float
    held: float  # share of samples in which the log's lock was held
    feed_held: float  # and the feed's
    waiting: float  # connections waiting for a lock, on average over the samples
    top: list[tuple[int, float, str]] = field(default_factory=list)  # the busiest: (calls, ms, text)
    sampler_cpu: float = 0.0  # seconds of CPU the sampler's own server process spent

    def per_publication(self, published: int) -> dict[str, Any]:
        """Statements, µs each write lock was held and µs waited for one, per publication; the statements
        the server spent the most time in, each with its calls and µs per publication."""
        n = max(1, published)
        return {
            "statements": self.statements / n,
            "held us": self.held * self.seconds / n * 1e6,
            "feed held us": self.feed_held * self.seconds / n * 1e6,
            "waited us": self.waiting * self.seconds / n * 1e6,
            "top": [(calls / n, ms * 1e3 / n, " ".join(query.split())) for calls, ms, query in self.top],
        }


class StoreSampler:
    """`with StoreSampler(admin_url, database) as sampler: ...`, then `sampler.load`."""

    def __init__(self, admin_url: str, database: str, interval: float = 0.05) -> None:
        self.admin_url, self.database, self.interval = admin_url, database, interval
        self.load = StoreLoad(0, 0.0, 0.0, 0.0, 0.0)
        self._stop = threading.Event()
        self._samples: list[tuple[int, int, int]] = []  # (log's held, feed's held, waiting)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._started = 0.0
        self._cpu = 0.0

    def __enter__(self) -> StoreSampler:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute("SELECT pg_stat_statements_reset()")
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        seconds = time.monotonic() - self._started
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            rows = [
                (int(calls), float(ms), str(query)) for calls, ms, query in admin.execute(_STATEMENTS, (self.database,))
            ]
        n = max(1, len(self._samples))
        held = sum(1 for locked, _, _ in self._samples if locked) / n
        feed_held = sum(1 for _, locked, _ in self._samples if locked) / n
        waiting = sum(waiters for _, _, waiters in self._samples) / n
        self.load = StoreLoad(
            sum(calls for calls, _, _ in rows), seconds, held, feed_held, waiting, rows[:TOP], self._cpu
        )

    def _sample(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            backend = admin.execute("SELECT pg_backend_pid()").fetchone()
            while not self._stop.wait(self.interval):
                row = admin.execute(_SAMPLE, {"db": self.database, "log": LOG_LOCK, "feed": FEED_LOCK}).fetchone()
                if row:
                    self._samples.append((int(row[0]), int(row[1]), int(row[2])))
            self._cpu = cpu_seconds(int(backend[0]), descendants=False) if backend else 0.0
