"""The gateways sharing a store: each one's position in the feed (compaction keeps every row some live
gateway has yet to fan out) and which gateway each connected subscription is delivered through (a
subscriber connected through two gateways at once would get its deliveries twice). A gateway is
live while it renews its row; a claim lives as long as its gateway does."""

from __future__ import annotations

import time
from collections.abc import Sequence

from veil.store.relational.dialect import Dialect


class GatewaySql(Dialect):
    def renew_gateway(self, gateway: str, incarnation: str, fanned_out: int) -> bool:
        # (a write of its own row: the feed's order alone, so that it never waits behind a round
        # while holding the log's lock that the publications' group commits wait for)
        with self._tx(log=False) as db:  # no row: another process took the name over, and left since
            renewed = db.execute(
                "UPDATE gateways SET fanned_out = ?, seen = ? WHERE gateway = ? AND incarnation = ? RETURNING gateway",
                (fanned_out, time.time(), gateway, incarnation),
            ).fetchone()
        return renewed is not None

    def take_over_gateway(self, gateway: str, incarnation: str, fanned_out: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM connections WHERE gateway = ?", (gateway,))
            db.execute(
                "INSERT INTO gateways(gateway, incarnation, fanned_out, seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (gateway) DO UPDATE SET incarnation = excluded.incarnation, "
                "fanned_out = excluded.fanned_out, seen = excluded.seen",
                (gateway, incarnation, fanned_out, time.time()),
            )

    def gateway_row(self, gateway: str) -> tuple[float, str] | None:
        with self._read() as db:
            row = db.execute("SELECT seen, incarnation FROM gateways WHERE gateway = ?", (gateway,)).fetchone()
        return None if row is None else (row[0], row[1])

    def fanned_out(self, alive_since: float) -> int:
        with self._read() as db:
            row = db.execute("SELECT COALESCE(MIN(fanned_out), 0) FROM gateways WHERE seen >= ?", (alive_since,))
            return int(row.fetchone()[0])

    def leave(self, gateway: str, incarnation: str) -> None:
        with self._tx() as db:
            ours = db.execute(
                "DELETE FROM gateways WHERE gateway = ? AND incarnation = ? RETURNING gateway", (gateway, incarnation)
            ).fetchone()
            if ours is not None:
                db.execute("DELETE FROM connections WHERE gateway = ?", (gateway,))

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
