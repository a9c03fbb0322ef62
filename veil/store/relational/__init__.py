"""The store written once in SQL, for every dialect: what each method reads and writes, in which
transaction. A dialect (`veil.store.sqlite`, `veil.store.postgres`) adds its schema, its connections
and the few fragments where SQL differs (array parameters, scalar min/max, how a batch of rows gets
its offsets); the statements use `?` placeholders and quote `"offset"`, which both dialects accept.

Every write transaction is serialized against every other (SQLite's single writer; PostgreSQL's
transaction-level advisory lock), so offsets and feed sequence numbers become visible in the order
they were given: a reader that has seen offset N has seen everything below it.

Its parts: `log` (what is logged), `deliveries` (feed rows, backlogs, cursors), `status` (what the
pipeline reports: progress, heartbeat, subscription state, quarantine), `dead_letters` (queues' bounds
and what left them past those), `compaction`, `gateways`
(their feed positions and connections) and `webhooks` (which no gateway delivers yet), over `dialect`
(the connection protocol, transactions and the `status` table's helpers). What is queued where, and
when it goes, is `veil.store.queues`'s policy: here is its SQL.
"""

from veil.store.relational.compaction import CompactionSql
from veil.store.relational.dead_letters import DeadLetterSql
from veil.store.relational.deliveries import DeliverySql
from veil.store.relational.dialect import LAST_FEED_SEQ, STATUS_WITHOUT_TOPK, Cursor, Db, Transaction
from veil.store.relational.gateways import GatewaySql
from veil.store.relational.log import LogSql
from veil.store.relational.status import StatusSql
from veil.store.relational.webhooks import WebhookSql


class RelationalStore(LogSql, DeliverySql, DeadLetterSql, StatusSql, CompactionSql, GatewaySql, WebhookSql):
    """The whole store interface; a dialect subclasses it."""


__all__ = ["LAST_FEED_SEQ", "STATUS_WITHOUT_TOPK", "Cursor", "Db", "RelationalStore", "Transaction"]
