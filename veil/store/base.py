"""The store's contract, in the two parts its two clients use: `GatewayStore` (appends, queues,
cursors, the pipeline's health as the gateway sees it) and `PipelineStore` (log reads, subscription
snapshots, delivery writes); both read the log's shared facts (`LogReader`). It imports no
implementation: `veil.store.open_store` chooses one by URL, and `veil.store.queues` holds what every
implementation decides alike.

Offsets are positions in one ordered log holding publications and subscription changes alike, so a
publication is matched against exactly the subscriptions whose changes precede it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from veil.protocol.envelope import Origin

KIND_PUBLICATION = 0
KIND_SUBSCRIBE = 1
KIND_UNSUBSCRIBE = 2
KIND_REGISTRY = 3  # a new registry version: later publications are authorized under it
KIND_TICK = 4  # the clock moved: stateful subscriptions' windows move with it even when nothing is published
KIND_COPY = 5  # a delivery decided after its publication was matched (stateful kinds, initial matches): a copy
KIND_CANCEL = 6  # a publisher withdrew a valid publication: later subscriptions do not get it
KIND_REDELIVER = 7  # a dead letter its subscription's owner replays: queued for it again, in log order
KEYS_KEPT = 120_000  # milliseconds a publisher's idempotency key is remembered, by default
# why a delivery became a dead letter: which bound of its queue it was past, or that its webhook
# endpoint did not take it in as many attempts as the operator allows
DEAD_LETTER_REASONS = ("deliveries", "bytes", "age", "attempts")
REPLAY_MOST = 10_000  # dead letters one replay queues again (one write transaction)


class Publication(NamedTuple):
    """What the gateway logs per publication: the bytes delivered, who published them and their
    signature, kept as columns (the envelope is written from them at delivery)."""

    body: bytes
    publisher: str = ""
    key_id: str | None = None
    signature: str | None = None
    valid_for: int | None = None  # milliseconds it stays valid: kept, and matched by new subscriptions
    key: str | None = None  # the publisher's idempotency key: a repeat within the window is not logged again


class QueueBounds(NamedTuple):
    """The most a subscription's queue holds: deliveries, bytes of their publications and their age
    (ms since they were logged). What is past them leaves the queue for its dead letters."""

    deliveries: int
    bytes: int
    age_ms: int

    def within(self, other: QueueBounds) -> QueueBounds:
        return QueueBounds(*(min(mine, theirs) for mine, theirs in zip(self, other, strict=True)))


class Webhook(NamedTuple):
    """Where a subscription's deliveries are POSTed instead of a connection, with the secret that
    signs them and the most deliveries one request carries."""

    url: str
    secret: str
    batch: int = 1


class WebhookSubscription(NamedTuple):
    """A live webhook subscription as the gateway that delivers it needs it: its version is the log
    offset that made it, which a replacement (perhaps to another endpoint) changes."""

    sub_id: str
    number: int
    owner: str
    webhook: Webhook
    version: int


class DeadLetter(NamedTuple):
    """A delivery that left its subscription's queue past one of its bounds, or that its webhook
    endpoint never took (`reason`, one of DEAD_LETTER_REASONS), kept whole: its publication may be
    compacted away meanwhile."""

    seq: int
    pub: int  # the publication's id (a copy's original's)
    reason: str
    at: int  # ms since the epoch when it was dead-lettered
    logged: int  # and when its publication was
    body: bytes
    origin: Origin


class LogEntry(NamedTuple):
    offset: int
    kind: int
    sub_id: str | None
    body: bytes | None
    client: str | None = None  # the publisher of a publication, the owner of a subscription
    time: int = 0  # milliseconds since the epoch when it was logged
    number: int | None = None  # a subscription's compact number (the one its queue and matches use)


class FeedEntry(NamedTuple):
    """The matches of one round: parallel arrays of subscription numbers and publication
    offsets, sorted by subscription number, then publication."""

    seq: int
    sub_nos: np.ndarray
    pubs: np.ndarray
    cropped: bool = False  # some of its matches deliver a cropped copy


class StatefulBatch(NamedTuple):
    """What a round decided beyond matching its own publications, each delivery as (subscription
    number, publication, cropped copy or None): what stateful subscriptions selected, in the order
    they did; new subscriptions' initial matches (older, still-valid publications); the saved state
    of each stateful subscription whose state changed (None for one that is gone); the oldest
    publication any of them may still select and the next moment the clock alone may select one
    (milliseconds), or None."""

    deliveries: list[tuple[int, int, bytes | None]]
    initials: list[tuple[int, int, bytes | None]]
    states: list[tuple[int, bytes | None]]
    held: int | None
    due: int | None


class Quarantined(NamedTuple):
    """A log entry the pipeline could not process: set aside, so that everything else goes on. A
    subscription may be named by its id alone (offset 0): the version in force is meant."""

    offset: int
    kind: int
    sub_id: str | None
    owner: str | None
    error: str


class Round(NamedTuple):
    """What one matching round of a matcher partition decided: the store records it whole, or not at
    all (`PipelineStore.record_round`). Plain matches are (subscription number, publication) pairs
    in two columns; `copies` are the matches that deliver a cropped copy, as (subscription number,
    publication, copy), and are among the pairs too."""

    sub_nos: np.ndarray | Sequence[int]
    pubs: np.ndarray | Sequence[int]
    end: int  # the log offset the round processed up to
    copies: Sequence[tuple[int, int, bytes]] = ()
    stateful: StatefulBatch | None = None
    quarantined: Sequence[Quarantined] = ()
    part: int = 0  # the partition whose progress it records
    took_ms: int | None = None
    start: int | None = None  # where it began: recorded only if the progress is still there
    owner: tuple[int, int] | None = None  # (matcher partition, task token): recorded only while it owns it
    built: bool = False  # its partition's state was built from the store (counted in `batch_durations`)


class QuarantineRecord(NamedTuple):
    seq: int
    offset: int
    kind: int
    sub_id: str | None
    owner: str | None
    error: str
    body: bytes | None
    time: float


class Totals(NamedTuple):
    """What the broker has done since its store was created (SELIS's operations summary): kept in
    the store, written in the transactions that do the work, so that restarts lose none of it."""

    received: int = 0  # publications acknowledged
    matched: int = 0  # publications that matched at least one subscription (and were authorized)
    matches: int = 0  # deliveries queued: (publication, subscription) pairs
    forwarded: int = 0  # deliveries sent to subscribers (again after a reconnect, if unacknowledged)
    subscriptions: int = 0  # live now
    subscribers: int = 0  # their distinct owners
    dead_lettered: tuple[int, ...] = (0,) * len(DEAD_LETTER_REASONS)  # deliveries past a bound, by reason
    dead_letters_expired: int = 0  # dead letters dropped past the age bound

    @property
    def queued(self) -> int:
        """Deliveries queued and not yet sent (a lower bound: sends again after a reconnect count)."""
        return max(0, self.matches - self.forwarded)


# Upper bounds (ms) of the round duration buckets the store counts (Prometheus' `le`); a last
# bucket takes the longer ones.
BATCH_BOUNDS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


class BatchDurations(NamedTuple):
    """How long the pipeline's rounds took, as their matcher tasks timed them: how many fell in each
    bucket of BATCH_BOUNDS_MS (and past the last), and their sum."""

    counts: tuple[int, ...] = (0,) * (len(BATCH_BOUNDS_MS) + 1)
    total_ms: int = 0
    # not a duration: rounds recorded whose partition state had to be built from the store, kept
    # beside the durations because the same transaction counts both
    state_builds: int = 0


class PipelineStatus(NamedTuple):
    """What the pipeline last said of itself: the process id it registered (0: none runs, or one is
    expected to start) and when, and at its last heartbeat (when: unix seconds) the last sign of
    life of the matcher partition heard from least recently (milliseconds; 0: not every one yet)
    and the partitions that had no running task; and how many entries are quarantined, the last one
    set aside (its seq) among them."""

    pid: int
    registered: float
    quiet_since: int
    heartbeat: float | None
    dark: tuple[int, ...] = ()
    quarantined: int = 0
    last_quarantined: int = 0


class LiveSubscription(NamedTuple):
    """What taking a live subscription onto a delivery connection needs of the store."""

    number: int
    body: bytes
    refusal: str | None  # why the live version was quarantined, if it was
    cursor: int  # the last publication delivered (or acknowledged) that was saved
    webhook: bool = False  # delivered to a webhook (by the gateway, never on a client's connection)


class StoreUnavailable(Exception):
    """The store cannot take writes now (disk full, I/O error, lock timeout): retry later."""


class StoreMissing(Exception):
    """The store does not exist where a process that must not create it looked for it."""


class StaleRegistry(Exception):
    """A registry change based on a version that is no longer the newest: nothing was written."""

    def __init__(self, current: int, base: int) -> None:
        super().__init__(f"the registry is at version {current}, not {base}")
        self.current = current
        self.base = base


class UnknownSubscription(LookupError):
    pass


class UnknownAnnouncement(LookupError):
    pass


class UnknownPublication(LookupError):
    """No publication with that id is still valid."""


class TooMany(Exception):
    """A client has as many of something (`what`: "subscriptions") as it may (`most`)."""

    def __init__(self, what: str, most: int) -> None:
        super().__init__(f"{most} {what}")
        self.what = what
        self.most = most


class NotOwner(PermissionError):
    """The id belongs to another client; `what` it names: "subscription", "announcement" or "publication"."""

    def __init__(self, what: str, key: object) -> None:
        super().__init__(f"{what} {key}")
        self.what = what


class Ownership(NamedTuple):
    owners: dict[int, int]  # `partition_owners`
    beats: dict[int, int]  # `partition_beats`
    cuts: tuple[int, int]  # `epoch_cuts`


class LogReader(ABC):
    """What both clients read: the log's extent and the subscriptions and registry in force."""

    @abstractmethod
    def head_offset(self) -> int: ...

    @abstractmethod
    def processed_offset(self) -> int:
        """The log offset up to which the pipeline has recorded its deliveries."""

    @abstractmethod
    def registry_at(self, offset: int | None = None) -> bytes | None:
        """The registry version in force just after `offset` (the newest one with offset=None)."""

    @abstractmethod
    def subscriptions_at(self, offset: int) -> list[tuple[str, int, str, bytes]]:
        """The subscriptions in force just after `offset`, as (id, number, owner, body): what a
        matcher must hold there (the quarantined ones left out)."""

    @abstractmethod
    def subscription_changes(self, after: int, upto: int) -> tuple[list[str], list[tuple[str, int, str, bytes]]]:
        """What changed between two offsets: ids to drop, then (id, number, owner, body) to add."""

    @abstractmethod
    def close(self) -> None: ...


class GatewayStore(LogReader):
    """The gateway's part: it appends to the log, serves the queues and keeps the cursors."""

    # what the store raises when it fails (not the caller): the store's condition, the client's to retry
    failures: tuple[type[Exception], ...] = (StoreUnavailable,)

    @abstractmethod
    def append_publications(
        self, publications: list[Publication], registry: int | None = None, keys_kept: int = KEYS_KEPT
    ) -> list[int]:
        """Durably append publications (one commit for all); returns their offsets. With `registry`,
        the version their publishers were authenticated and admitted with: StaleRegistry, and nothing
        written, if a newer one was stored meanwhile (a revocation holds from its acknowledgement on,
        at the cost of one indexed read in a transaction that writes anyway). A publication with a
        `key` its publisher gave one within the last `keys_kept` milliseconds (this call's included)
        is not logged: its offset is the first one's, whatever its bytes (the key names the
        publication, as a message id does), so that a publisher retrying after a lost answer
        publishes once."""

    @abstractmethod
    def put_registry(self, body: bytes, file_digest: int | None = None, base: int | None = None) -> int:
        """Log a new registry version (a JSON document) and make it the current one; returns its
        version (its offset). `file_digest` records, in the same transaction, that it came from the
        registry file with that digest. With `base`, only if the newest version is still `base` (0:
        none yet), checked in the same transaction: StaleRegistry otherwise, and nothing is written."""

    @abstractmethod
    def newest_registry(self) -> tuple[int, bytes | None]:
        """The newest registry version and its document, in one read; (0, None) when there is none."""

    @abstractmethod
    def registry_version(self) -> int:
        """The newest registry version (0: none): one index lookup, for a check on every request."""

    @abstractmethod
    def registry_file_digest(self) -> int | None:
        """The digest of the registry file last applied, if one was."""

    @abstractmethod
    def cancel_publication(self, pub: int, publisher: str) -> int:
        """Withdraw a still-valid publication of this publisher (UnknownPublication, NotOwner); later
        subscriptions no longer receive it as an initial match."""

    @abstractmethod
    def put_announcement(self, ann_id: str, owner: str, body: bytes) -> None:
        """Register or replace an edge broker's announcement; NotOwner if the id is someone else's."""

    @abstractmethod
    def remove_announcement(self, ann_id: str, owner: str) -> None:
        """UnknownAnnouncement / NotOwner."""

    @abstractmethod
    def announcement(self, ann_id: str) -> tuple[str, bytes] | None:
        """(owner, body) of an announcement."""

    @abstractmethod
    def put_subscription(
        self, sub_id: str, owner: str, body: bytes, most: int | None = None, bounds: QueueBounds | None = None,
        since: int | None = None, webhook: Webhook | None = None, most_webhooks: int | None = None,
    ) -> int:  # fmt: skip
        """Register a subscription, or replace its owner's live one (which keeps its number); NotOwner
        if the id belongs to someone else's live subscription; TooMany if it is new and its owner has
        `most` live subscriptions already. Any other new subscription gets a number never given
        before, even under an id used before. `bounds`: those its subscriber set on its queue (None:
        the operator's); `since` (ms): it replays the retained log from then on (compaction keeps what
        it replays until the pipeline has); `webhook`: its deliveries are POSTed there (TooMany if its
        owner has `most_webhooks` other live webhook subscriptions). Returns the offset that logged it."""

    @abstractmethod
    def logged_since(self, time: int) -> int:
        """About how many log entries were logged at `time` (ms) or later: what a replay from then reads at most."""

    @abstractmethod
    def replaying(self, owner: str) -> bool:
        """Whether a subscription of `owner`'s made with a `since` is not yet past the pipeline."""

    @abstractmethod
    def remove_subscription(self, sub_id: str, owner: str) -> int:
        """Unsubscribe and drop its queue; UnknownSubscription when the owner has no live subscription
        of this id (whether someone else has one is not told)."""

    @abstractmethod
    def subscription_owner(self, sub_id: str) -> str | None: ...

    @abstractmethod
    def owned_subscriptions(
        self, owner: str, after: str = "", limit: int = 1000, only: str | None = None
    ) -> list[tuple[str, int, bytes]]:
        """The owner's live subscriptions with ids after `after` (or the one of id `only`), in id
        order, at most `limit`: (id, the log offset that made it, its stored body)."""

    @abstractmethod
    def owned_sizes(self, owner: str, after: str = "", limit: int = 1000) -> list[tuple[str, int]]:
        """As owned_subscriptions, the ids and the sizes of the bodies only (a page is cut by them
        before any body is read)."""

    @abstractmethod
    def live_subscriptions(self, sub_ids: Sequence[str], owner: str) -> list[LiveSubscription | None]:
        """For each id, its live subscription if `owner` holds it (None: nobody's, or someone else's),
        all read in one statement: a connection of a thousand subscriptions costs one trip to the
        store, not a thousand, and holds up nobody else's reads meanwhile."""

    @abstractmethod
    def live_numbers(self, sub_ids: Sequence[str]) -> list[int | None]:
        """Each id's live subscription's number (None: no live subscription has it), read in one statement."""

    @abstractmethod
    def subscription_number(self, sub_id: str, owner: str | None = None) -> int | None:
        """The compact number the id's live subscription goes by in queues and feeds (None: none, or
        not `owner`'s when given), read with its owner in one statement."""

    @abstractmethod
    def subscription_refusal(self, sub_id: str) -> str | None:
        """Why the live version of a subscription was quarantined, if it was."""

    @abstractmethod
    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        """The feed rows after `seq` (matches of the pipeline's rounds), in the order the pipeline wrote
        them: at most `limit`, and no more than hold about `queues.FEED_READ_PAIRS` matches."""

    @abstractmethod
    def last_feed_seq(self) -> int: ...

    feed_signal = False  # whether `wait_for_feed` waits for a signal (otherwise the hub polls)

    def wait_for_feed(self, seq: int, timeout: float) -> int:
        """The feed's last row once it is after `seq`, or as it is after `timeout` seconds (a store
        that cannot signal returns `seq` at once: the hub polls it)."""
        return seq

    @abstractmethod
    def bodies(self, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin, int]]:
        """The published bytes of these publications, where they came from, and when they were
        logged (ms since the epoch)."""

    @abstractmethod
    def copies(self, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        """The cropped copies among these (subscription number, publication) matches."""

    @abstractmethod
    def backlogs(
        self, numbers: np.ndarray, afters: np.ndarray, limit: int | np.ndarray, from_seq: int = 0
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Many subscriptions' queued matches at once (by number, each after its own publication, at
        most `limit` each, one for all or one per number; of the unspilled feed, the entries from seq
        `from_seq` on): (subscription numbers, publications) sorted by both, the highest feed seq
        visible to the same read, and the feed seq a next read may start from. Bodies are looked up
        as for the feed (`bodies`, `copies`)."""

    @abstractmethod
    def cursor(self, sub_id: str) -> int: ...

    @abstractmethod
    def save_cursors(
        self, cursors: dict[int, int], forwarded: int = 0, acked: dict[int, list[int]] | None = None
    ) -> None:
        """Save cursors by subscription number (those of subscriptions no longer live are dropped),
        and count `forwarded` deliveries sent since the last call. `acked`: publications a shared
        subscription's members acknowledged past its cursor (which moves only over an unbroken run of
        them), kept so that no later connection is sent them again; those the cursor passes go."""

    @abstractmethod
    def acked(self, numbers: Sequence[int]) -> dict[int, list[int]]:
        """The publications kept as acknowledged past these subscriptions' cursors (`save_cursors`),
        for those that have any."""

    @abstractmethod
    def totals(self) -> Totals: ...

    @abstractmethod
    def batch_durations(self) -> BatchDurations: ...

    @abstractmethod
    def renew_gateway(self, gateway: str, incarnation: str, fanned_out: int) -> bool:
        """This gateway (the process `incarnation` of it) is alive, its delivery connections' claims
        with it, and has fanned out the feed up to seq `fanned_out`. False, and nothing changes, when
        another process has taken the name over since (whether or not that one has left again)."""

    @abstractmethod
    def take_over_gateway(self, gateway: str, incarnation: str, fanned_out: int) -> None:
        """A gateway starts under this name as process `incarnation`: the claims of whichever process
        held the name before are dropped, and the name's row is this one's."""

    @abstractmethod
    def gateway_row(self, gateway: str) -> tuple[float, str] | None:
        """When `gateway` last renewed its row (unix seconds) and which process did, None if it has none."""

    @abstractmethod
    def fanned_out(self, alive_since: float) -> int:
        """The feed seq every gateway renewed since `alive_since` (unix seconds) has fanned out."""

    @abstractmethod
    def leave(self, gateway: str, incarnation: str) -> None:
        """A gateway stops: its feed position and its connections' claims go (unless another process
        has taken its name over since: they are that one's)."""

    @abstractmethod
    def claim_subscriptions(
        self, sub_ids: Sequence[str], numbers: Sequence[int], gateway: str, at: float, alive_since: float
    ) -> tuple[str, str | None] | None:
        """Record that `gateway` delivers to these subscriptions (each id's subscription of that
        number) from now on (claim time `at`), all of them or none. When one is live no more (removed
        since it was admitted, perhaps taken again by its owner or someone else), (that id, None); when
        another gateway renewed since `alive_since` holds one, (that id, that gateway); and nothing
        changes. Which gateway holds an id is told only to a connection of its live subscription."""

    @abstractmethod
    def release_subscriptions(self, sub_ids: Sequence[str], gateway: str, at: float) -> None:
        """The connection that claimed these at `at` ended (a later claim by the same gateway stays)."""

    @abstractmethod
    def compact(self, limit: int, fanned_out: int, spill_before: float, retained_since: int | None = None) -> int:
        """One bounded step of housekeeping (the policy is `veil.store.queues`'s). Feed entries that
        every gateway has fanned out (seq <= `fanned_out`) and that were created before `spill_before` get
        their unconsumed matches spilled into per-subscription queues, then go; up to `limit` queued
        deliveries that their subscriptions consumed go, and so do publications that neither the
        pipeline nor any queue still needs, nor were logged since `retained_since` (ms: the retention,
        with the registry versions in force then), and up to `limit` idempotency keys past their window.
        Returns the rows handled; below `limit` means nothing is left for now."""

    @abstractmethod
    def bound_queues(self, bounds: QueueBounds, now: int, alive_since: float, limit: int, ages: bool = True) -> int:
        """Dead-letter what the queues of live subscriptions that no gateway renewed since
        `alive_since` holds (none is read) hold past their bounds (each subscription's own, within
        the operator's `bounds`) at `now` (ms), after their cursors, oldest first, about `limit`
        deliveries at most, and drop the dead letters past the operator's age bound; returns how
        many. Count and bytes bounds are checked against counts, not the queue: only a queue past
        one is read; age bounds (`ages`) cost a read of each queue's oldest delivery."""

    @abstractmethod
    def bound_held_queues(
        self, floors: Mapping[int, int], gateway: str, bounds: QueueBounds, now: int, limit: int
    ) -> int:
        """`bound_queues` for subscriptions `gateway` holds (those another holds are left alone), by
        number, each after its floor: the last delivery its connection read from the store."""

    @abstractmethod
    def unclaimed_webhooks(self, alive_since: float, after: int, limit: int) -> list[WebhookSubscription]:
        """Live webhook subscriptions numbered after `after`, not quarantined, that no gateway renewed
        since `alive_since` (unix seconds) delivers, in number order, at most `limit`."""

    @abstractmethod
    def webhook_versions(self, numbers: Sequence[int], alive_since: float) -> dict[int, tuple[int, str | None]]:
        """Of these subscription numbers, those still live webhook subscriptions (not quarantined):
        their versions, and the gateway renewed since `alive_since` that delivers each, if one does."""

    @abstractmethod
    def dead_letter_unsent(self, number: int, pubs: Sequence[int], through: int, now: int) -> int:
        """A webhook subscription's deliveries of these publications (in order) were not taken by its
        endpoint: they become its dead letters (reason "attempts"), and its cursor moves past them
        and up to `through` (what was delivered after them), in one transaction, so that they are
        never both sent again and dead letters. Returns how many (none if the subscription is live
        no more)."""

    @abstractmethod
    def dead_letters(
        self, number: int, after: int = 0, limit: int = 1000, budget: int = 2**62
    ) -> tuple[list[DeadLetter], int | None]:
        """A subscription's dead letters with seq > `after`, oldest first, at most `limit` and no more
        than hold `budget` bytes of publications (one at least), and the `after` of the next page
        (None: there is none). A dead letter holds its publication
        (and cropped copy) in the store as a queued delivery does; it goes after `bound_queues`'s age
        bound, counted from when it left its queue."""

    @abstractmethod
    def dead_letter_count(self, number: int) -> int: ...

    @abstractmethod
    def purge_dead_letters(self, number: int, upto: int | None = None) -> int:
        """Drop a subscription's dead letters (those with seq <= `upto`); returns how many."""

    @abstractmethod
    def replay_dead_letters(
        self, sub_id: str, number: int, upto: int | None = None, most: int = REPLAY_MOST
    ) -> tuple[int, int]:
        """Queue a live subscription's dead letters (the first `most` of those with seq <= `upto`)
        again, in their order, and drop them; returns how many, and how many of those asked for are
        left. They are logged (KIND_REDELIVER), so the pipeline queues each after everything queued
        for the subscription before, still under the registry in force."""

    @abstractmethod
    def quarantine(self, after: int = 0, limit: int = 1000) -> list[QuarantineRecord]:
        """Quarantined entries with seq > `after`, oldest first."""

    @abstractmethod
    def quarantined_at(self, offset: int) -> QuarantineRecord | None: ...

    @abstractmethod
    def release_quarantined(self, offset: int) -> bool:
        """Drop a quarantined entry from the quarantine (the operator looked at it); False if none was.
        It stays known as dropped: a partition behind the others (or a replayed round) that fails on
        the same entry later sets nothing aside again, where a deleted row would come back."""

    @abstractmethod
    def expect_pipeline(self) -> None:
        """Forget the registered pipeline: until a new one registers, none counts as running."""

    @abstractmethod
    def pipeline_status(self) -> PipelineStatus:
        """What the pipeline last registered and beat (pid 0 if none ever registered), and the quarantine."""


class PipelineStore(LogReader):
    """The pipeline's part: it reads the log by offset and records what each round decided."""

    @abstractmethod
    def log_range(self, start: int, end: int, without: tuple[int, ...] = ()) -> list[LogEntry]:
        """Entries with start < offset <= end, in offset order, leaving out the kinds `without`
        (where the pipeline's own copies are most of the log, not reading them is most of the work)."""

    @abstractmethod
    def valid_at(self, offset: int, time: int, since: int | None = None) -> list[tuple[int, bytes, str]]:
        """The publications logged before `offset`, valid at `time` (ms) and not withdrawn before
        `offset`, as (offset, body, publisher): a subscription logged there receives the ones it matches.
        With `since`, those logged before it only (the later ones are `retained_since`'s)."""

    @abstractmethod
    def retained_since(
        self, offset: int, since: int, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes, str, int]]:
        """A page of the publications the log still holds that were logged at `since` (ms) or later
        and before `offset`, after offset `after`, in log order, at most `limit`: those neither
        quarantined nor withdrawn before `offset`, as (offset, body, publisher, the registry version
        in force when it was logged, 0 for none): a subscription logged at `offset` asking for what
        matched since then receives the ones it matches and may see under that version."""

    @abstractmethod
    def record_round(self, done: Round) -> bool:
        """Queue the matches of matcher partition `done.part`'s round as feed rows (`queues.feed_rows`),
        with the cropped copies some of them deliver, and record the partition's processed offset,
        in one transaction; matches of publications at or below the offset the partition already
        recorded are dropped, so a replayed round delivers nothing twice. The pipeline's processed
        offset, its oldest held publication and next expiry are the least of its partitions';
        `took_ms`, how long the round took, is counted in `batch_durations`. A round with matches
        also records its matches per log entry (`matches_per_entry`), by which the next rounds are
        sized. What stateful subscriptions selected is logged as copies (KIND_COPY) of the
        publications, so that each subscription's queue stays in the order it was decided; initial
        matches queue as plain matches (they precede the subscription's others); the new states are kept
        with them: all of it only when the round is new, since a replay recomputes them. Entries the
        round could not process are set aside in the quarantine.

        A round that says where it `start`-ed is recorded only if the partition's progress is still
        there, and one that names its `owner` only while that task owns the matcher partition: a
        round that another task recorded past meanwhile, or made by a task that lost the partition
        (paused while another adopted it), is dropped whole, since its stateful deliveries were
        decided from a state that the recorded rounds no longer match. False if it was dropped."""

    @abstractmethod
    def set_partitions(self, partitions: int) -> list[int]:
        """Start keeping progress for this many matcher partitions; returns each one's processed
        offset. A changed count moves subscriptions between partitions, so then all of them start
        again from the least offset any had reached (rounds past it are recorded again)."""

    @abstractmethod
    def claim_range(self, rows: int, part: int) -> tuple[int, int]:
        """Publication partitioning: the next range of the log for matcher partition `part`, (start,
        end], at most `rows` entries, none if the log holds nothing past the last range claimed; or
        the range `part` claimed before if it is not recorded yet (its task died, or gave up waiting
        for the ranges before it). Ranges are handed out in log order and recorded in that order as
        partition 0's progress, so each subscription's matches queue in publication order whichever
        partition matched them; claims are void once `set_partitions` is called again (the pipeline
        restarted)."""

    @abstractmethod
    def partition_offset(self, part: int) -> int:
        """How far matcher partition `part` has recorded the log."""

    @abstractmethod
    def wait_for_log(self, offset: int, timeout: float) -> int:
        """The log's head, once it is past `offset` or `timeout` seconds have passed."""

    @abstractmethod
    def partition_beat(self, parts: Sequence[int]) -> None:
        """These matcher partitions are alive and waiting for the log (recording a round says so too).
        One statement, without the write locks that transactions take on PostgreSQL (a task beats
        twice a second); `adopt_partition`, which acts on a beat it read, waits for one being written
        there."""

    @abstractmethod
    def partition_beats(self) -> dict[int, int]:
        """When (ms) each matcher partition last recorded a round or said it waits."""

    @abstractmethod
    def own_partition(self, part: int, token: int) -> None:
        """The task `token` of partition `part` has started: the partition is its (and alive)."""

    @abstractmethod
    def adopt_partition(self, part: int, token: int, beat: int | None) -> bool:
        """Task `token` takes over partition `part` if its last sign of life is still `beat` (as
        `partition_beats` gave it; None: there was none), which the caller saw unchanged for as
        long as it calls silence by its own clock: machines' clocks need not agree. True if it did."""

    @abstractmethod
    def partition_owners(self) -> dict[int, int]:
        """Which task (token) last started or adopted each matcher partition."""

    @abstractmethod
    def partition_ownership(self) -> Ownership:
        """What a task looks at every BEAT, in one read."""

    @abstractmethod
    def claim_partitions(self, epoch: int, task: int, tasks: int, partitions: int, wanted: Sequence[int]) -> list[int]:
        """The matcher partitions task number `task` of `tasks` runs in `epoch` (a number of its own):
        those it (an earlier attempt of it) claimed already, then of `wanted`, in order, those no
        task of the epoch claimed, up to its share of the `partitions` (as even as shares go: one
        more for as many tasks as the division leaves over). The task counts as arrived."""

    @abstractmethod
    def arrivals(self, epoch: int) -> int:
        """How many tasks of `epoch` have claimed partitions."""

    @abstractmethod
    def end_leases(self, parts: Sequence[int], epoch: int) -> None:
        """The task that claimed these matcher partitions in `epoch` has reached the epoch's deadline."""

    @abstractmethod
    def leases(self, epoch: int) -> tuple[set[int], set[int]]:
        """The matcher partitions claimed in `epoch`, and those whose task has reached its deadline."""

    @abstractmethod
    def cut_epoch(self, lost: bool) -> None:
        """The epoch in progress ends now: executors joined, or (`lost`) left."""

    @abstractmethod
    def epoch_cuts(self) -> tuple[int, int]:
        """How many times `cut_epoch` was called, and how many of those with executors lost: an
        epoch planned when these were less is cut."""

    @abstractmethod
    def matches_per_entry(self) -> int:
        """Matches per log entry in the last batch that had any (0 before the first)."""

    @abstractmethod
    def append_tick(self) -> int:
        """Log the current time: when a stateful subscription is due (every partition's next round
        moves its clock there), and once at start, to run the first rounds before saying it runs."""

    @abstractmethod
    def subscription_states(self, numbers: Sequence[int]) -> dict[int, bytes]:
        """The saved states of these stateful subscriptions, as of the processed offset."""

    @abstractmethod
    def due(self) -> int | None:
        """When (ms) the clock alone may next select something for a stateful subscription, as of
        the processed offset; None if nothing will."""

    @abstractmethod
    def claim_pipeline(self) -> bool:
        """Be the one pipeline of this store, or go on being it: False while another process is (it
        waits as a standby), or once this one lost its claim (it must stop matching). Held until the
        process ends or closes the store."""

    @abstractmethod
    def register_pipeline(self, pid: int) -> None:
        """A pipeline process (`pid`) is running the query; 0 when it stops."""

    @abstractmethod
    def heartbeat(self, quiet_since: int, dark: Sequence[int] | None = ()) -> None:
        """The pipeline is alive; the matcher partition heard from least recently last gave a sign of
        life at `quiet_since` (ms; 0 before every one has); `dark`: the matcher partitions that, as
        far as the pipeline's driver can tell, have no running task (None: as last written)."""


class EventStore(GatewayStore, PipelineStore):
    """One implementation serves both parts; each client is typed by the part it uses."""
