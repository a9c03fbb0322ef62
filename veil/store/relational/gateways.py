"""The gateways sharing a store: each one's position in the feed (compaction keeps every row some live
gateway has yet to fan out) and which gateway each connected subscription is delivered through (a
subscriber connected through two gateways at once would get its deliveries twice). A gateway is
live while it renews its row; a claim lives as long as its gateway does."""

from __future__ import annotations

import time
from collections.abc import Sequence

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

    def gateway_seen(self, gateway: str) -> float | None:
        with self._read() as db:
            row = db.execute("SELECT seen FROM gateways WHERE gateway = ?", (gateway,)).fetchone()
        return None if row is None else row[0]

    def leave(self, gateway: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM connections WHERE gateway = ?", (gateway,))
            db.execute("DELETE FROM gateways WHERE gateway = ?", (gateway,))

    def claim_subscriptions(
        self, sub_ids: Sequence[str], numbers: Sequence[int], gateway: str, at: float, alive_since: float
    ) -> tuple[str, str | None] | None:
        with self._tx() as db:
            live = self._live_numbers(db, sub_ids)
            lost = sorted(sub_id for sub_id, number in zip(sub_ids, numbers, strict=True) if live.get(sub_id) != number)
            if lost:
                return lost[0], None
            held = db.execute(
                "SELECT c.sub_id, c.gateway FROM connections c JOIN gateways g ON g.gateway = c.gateway "
                f"WHERE c.sub_id {self.IN_NAMES} AND c.gateway <> ? AND g.seen >= ? ORDER BY c.sub_id LIMIT 1",
                (self._names(sub_ids), gateway, alive_since),
            ).fetchone()
            if held is not None:
                return held[0], held[1]
            db.executemany(
                "INSERT INTO connections(sub_id, gateway, since) VALUES (?, ?, ?) "
                "ON CONFLICT (sub_id) DO UPDATE SET gateway = excluded.gateway, since = excluded.since",
                # in one order, so that two gateways claiming the same ids cannot deadlock
                [(sub_id, gateway, at) for sub_id in sorted(sub_ids)],
            )
        return None

    def release_subscriptions(self, sub_ids: Sequence[str], gateway: str, at: float) -> None:
        with self._tx() as db:
            db.execute(
                f"DELETE FROM connections WHERE sub_id {self.IN_NAMES} AND gateway = ? AND since = ?",
                (self._names(sub_ids), gateway, at),
            )
