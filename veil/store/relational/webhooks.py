"""Webhook subscriptions: which of them no gateway delivers yet, and what their endpoints never took.
A webhook belongs to its subscription's number, so it goes with the subscription (`put_subscription`
writes it with each version, `remove_subscription` drops it)."""

from __future__ import annotations

from collections.abc import Sequence

from veil.store.base import Webhook, WebhookSubscription
from veil.store.relational.dialect import Dialect, add_status, count_change
from veil.store.relational.log import LIVE_NUMBER

# live webhook subscriptions, with the version (log offset) in force, left out the quarantined ones
LIVE_WEBHOOKS = (
    "SELECT s.sub_id, n.no, s.owner, w.url, w.secret, w.batch, s.created FROM webhooks w "
    "JOIN subscription_numbers n ON n.no = w.sub_no JOIN subscriptions s ON s.sub_id = n.sub_id "
    'WHERE s.deleted IS NULL AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q."offset" = s.created '
    "AND q.released IS NULL) "
)


class WebhookSql(Dialect):
    def unclaimed_webhooks(self, alive_since: float, limit: int) -> list[WebhookSubscription]:
        with self._read() as db:
            rows = db.execute(
                LIVE_WEBHOOKS + "AND NOT EXISTS (SELECT 1 FROM connections k JOIN gateways g ON g.gateway = k.gateway "
                "WHERE k.sub_id = s.sub_id AND g.seen >= ?) ORDER BY w.sub_no LIMIT ?",
                (alive_since, limit),
            ).fetchall()
        return [
            WebhookSubscription(sub_id, number, owner, Webhook(url, secret, batch), created)
            for sub_id, number, owner, url, secret, batch, created in rows
        ]

    def webhook_versions(self, numbers: Sequence[int]) -> dict[int, int]:
        if not numbers:
            return {}
        with self._read() as db:
            rows = db.execute(LIVE_WEBHOOKS + f"AND w.sub_no {self.IN_IDS}", (self._ids(numbers),)).fetchall()
        return {int(row[1]): int(row[6]) for row in rows}

    def dead_letter_unsent(self, number: int, pubs: Sequence[int], now: int) -> int:
        if not pubs:
            return 0
        with self._tx() as db:
            live = db.execute(f"SELECT n.sub_id FROM subscription_numbers n WHERE n.no = ? AND EXISTS ({LIVE_NUMBER})",
                              (number,)).fetchone()  # fmt: skip
            if live is None:
                return 0
            db.executemany(
                "INSERT INTO dead_letters(sub_no, pub, reason, at) VALUES (?, ?, 'attempts', ?)",
                [(number, pub, now) for pub in pubs],
            )
            db.execute(
                "INSERT INTO cursors(sub_id, pub) VALUES (?, ?) "
                f"ON CONFLICT (sub_id) DO UPDATE SET pub = {self.GREATEST}(cursors.pub, excluded.pub)",
                (live[0], max(pubs)),
            )
            add_status(db, "dead_lettered.attempts", len(pubs))
            count_change(db)
        return len(pubs)
