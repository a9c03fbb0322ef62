"""Webhook subscriptions: which of them no gateway delivers yet, and what their endpoints never took.
A webhook belongs to its subscription's number, so it goes with the subscription (`put_subscription`
writes it with each version, `remove_subscription` drops it).

The reads are driven by the webhooks table (and the numbers asked), each subscription's live
version looked up by its id: joined instead, SQLite's planner walks every live subscription."""

from __future__ import annotations

from collections.abc import Sequence

from veil.store.base import Webhook, WebhookSubscription
from veil.store.relational.dialect import Dialect, add_status, count_change
from veil.store.relational.log import LIVE_NUMBER

# a webhook's live version (NULL: none), its owner, and whether that version is quarantined
VERSION = "(SELECT s.created FROM subscriptions s WHERE s.sub_id = n.sub_id AND s.deleted IS NULL)"
OWNER = "(SELECT s.owner FROM subscriptions s WHERE s.sub_id = n.sub_id AND s.deleted IS NULL)"
QUARANTINED = (
    'EXISTS (SELECT 1 FROM subscriptions s JOIN quarantine q ON q."offset" = s.created AND q.released IS NULL '
    "WHERE s.sub_id = n.sub_id AND s.deleted IS NULL)"
)
# the live gateway delivering it, if one is
HOLDER = (
    "(SELECT k.gateway FROM connections k JOIN gateways g ON g.gateway = k.gateway "
    "WHERE k.sub_id = n.sub_id AND g.seen >= ?)"
)


class WebhookSql(Dialect):
    def unclaimed_webhooks(self, alive_since: float, after: int, limit: int) -> list[WebhookSubscription]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT n.sub_id, n.no, {OWNER}, w.url, w.secret, w.batch, {VERSION} FROM webhooks w "
                f"JOIN subscription_numbers n ON n.no = w.sub_no WHERE w.sub_no > ? AND EXISTS ({LIVE_NUMBER}) "
                f"AND NOT {QUARANTINED} AND {HOLDER} IS NULL ORDER BY w.sub_no LIMIT ?",
                (after, alive_since, limit),
            ).fetchall()
        return [
            WebhookSubscription(sub_id, number, owner, Webhook(url, secret, batch), created)
            for sub_id, number, owner, url, secret, batch, created in rows
        ]

    def webhook_versions(self, numbers: Sequence[int], alive_since: float) -> dict[int, tuple[int, str | None]]:
        if not numbers:
            return {}
        with self._read() as db:
            rows = db.execute(
                f"SELECT w.sub_no, {VERSION}, {HOLDER} FROM webhooks w JOIN subscription_numbers n ON n.no = w.sub_no "
                f"WHERE w.sub_no {self.IN_IDS} AND NOT {QUARANTINED}",
                (alive_since, self._ids(numbers)),
            ).fetchall()
        return {int(number): (int(version), holder) for number, version, holder in rows if version is not None}

    def dead_letter_unsent(self, number: int, pubs: Sequence[int], through: int, now: int) -> int:
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
                (live[0], max(through, *pubs)),
            )
            add_status(db, "dead_lettered.attempts", len(pubs))
            count_change(db)
        return len(pubs)
