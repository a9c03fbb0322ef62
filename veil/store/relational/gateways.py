"""The gateways sharing a store: each one's position in the feed (compaction keeps every row some live
gateway has yet to fan out) and which gateway each connected subscription is delivered through (a
subscriber connected through two gateways at once would get its deliveries twice). A gateway is
live while it renews its row; a claim lives as long as its gateway does."""

from __future__ import annotations

import time

from veil.store.relational.dialect import Dialect


class GatewaySql(Dialect):
    def renew_gateway(self, gateway: str, fanned_out: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO gateways(gateway, fanned_out, seen) VALUES (?, ?, ?) ON CONFLICT (gateway) "
                "DO UPDATE SET fanned_out = excluded.fanned_out, seen = excluded.seen",
                (gateway, fanned_out, time.time()),
            )

    def fanned_out(self, alive_since: float) -> int:
        with self._read() as db:
            return db.execute(
                "SELECT COALESCE(MIN(fanned_out), 0) FROM gateways WHERE seen >= ?", (alive_since,)
            ).fetchone()[0]

    def leave(self, gateway: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM connections WHERE gateway = ?", (gateway,))
            db.execute("DELETE FROM gateways WHERE gateway = ?", (gateway,))

    def claim_subscription(self, sub_id: str, gateway: str, at: float, alive_since: float) -> str | None:
        with self._tx() as db:
            holder = db.execute(
                "SELECT c.gateway FROM connections c JOIN gateways g ON g.gateway = c.gateway "
                "WHERE c.sub_id = ? AND c.gateway <> ? AND g.seen >= ?",
                (sub_id, gateway, alive_since),
            ).fetchone()
            if holder is not None:
                return holder[0]
            db.execute(
                "INSERT INTO connections(sub_id, gateway, since) VALUES (?, ?, ?) "
                "ON CONFLICT (sub_id) DO UPDATE SET gateway = excluded.gateway, since = excluded.since",
                (sub_id, gateway, at),
            )
        return None

    def release_subscription(self, sub_id: str, gateway: str, at: float) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM connections WHERE sub_id = ? AND gateway = ? AND since = ?", (sub_id, gateway, at))
