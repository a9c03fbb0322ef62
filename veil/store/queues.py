"""What every store decides alike, so that a dialect adds only its SQL and its connections.

Group commit: the gateway funnels appends through one writer thread (`gateway.ingest`), and a store
commits each list it is given in one transaction, so many concurrent publishes share one fsync.

Matches are queued in two tiers. The pipeline writes each round's matches as one packed feed
row (16 bytes a match, one insert a round); a feed row is the durable queue for every match in it.
Once a row is `SPILL_AFTER` seconds old and the hub has fanned it out, compaction spills the matches
its subscriptions have not yet consumed into per-subscription queue rows, and the feed row can go.
A subscriber that keeps up therefore costs no per-match row at all; one that lags or is away gets a
queue of its own. Publications are monotonic across feed rows (a replayed batch is not written
twice), so a backlog is the spilled rows followed by the unspilled feed.

Compaction runs every `COMPACT_INTERVAL` seconds (up to `COMPACT_IDLE_INTERVAL` while idle) in
steps of about `COMPACT_CHUNK` rows, one transaction each, so it never holds the write lock for
long. A publication can go once it is below the horizon: the pipeline has passed it, no queue or
feed row still holds it, no stateful subscription may still select it, and it is no longer valid
for subscriptions to come.
"""

from __future__ import annotations

import numpy as np

from veil.store.base import FeedEntry

SPILL_AFTER = 2.0  # seconds a match may wait in the feed before it gets its own queue row
COMPACT_INTERVAL = 2.0  # seconds between compaction rounds
COMPACT_IDLE_INTERVAL = 16.0  # at most, while they find nothing to do and nothing moves
COMPACT_CHUNK = 20000  # rows per compaction step (one transaction)
FEED_ROW_PAIRS = 1 << 20  # matches per feed row at most (16 MiB)
FEED_READ_PAIRS = 4 << 20  # matches the hub reads from the feed at once, about (it takes at least a row)
NEVER = np.iinfo(np.int64).max


def feed_rows(sub_nos: np.ndarray, pubs: np.ndarray) -> list[tuple[bytes, int]]:
    """A round's matches as feed rows: each row's pairs sorted by (subscription number, publication),
    so that a subscription's matches are one binary search away and spilled rows fill the queue index
    in order, with the oldest publication the row holds. A row holds at most FEED_ROW_PAIRS pairs:
    whatever reads the feed (the gateway's hub, compaction) holds a row whole, and one round of many
    publications matching many subscriptions would otherwise be hundreds of megabytes. The rows
    follow each other in pair order, so a subscription whose matches span two rows gets them in
    publication order."""
    sub_nos, pubs = sorted_pairs(sub_nos, pubs)
    return [
        (sub_nos[low : low + FEED_ROW_PAIRS].tobytes() + pubs[low : low + FEED_ROW_PAIRS].tobytes(),
         int(pubs[low : low + FEED_ROW_PAIRS].min()))
        for low in range(0, len(pubs), FEED_ROW_PAIRS)
    ]  # fmt: skip


def sorted_pairs(sub_nos: np.ndarray, pubs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(subscription number, publication) pairs in that order. A round's publications span a few
    thousand offsets, so both fit one int64 key, and one sort of the keys takes a tenth of the time
    of `np.lexsort` over both columns (13 against 177 ms for a million pairs); pairs whose key
    would not fit are sorted by both columns."""
    if not len(pubs):
        return sub_nos, pubs
    low = int(pubs.min())
    bits = (int(pubs.max()) - low).bit_length()
    if bits >= 62 or int(sub_nos.min()) < 0 or int(sub_nos.max()) >> (62 - bits):
        order = np.lexsort((pubs, sub_nos))
        return sub_nos[order], pubs[order]
    keys = np.sort((sub_nos << bits) | (pubs - low))
    return keys >> bits, (keys & ((1 << bits) - 1)) + low


def distinct(values: np.ndarray) -> int:
    """How many different values: counted over their span when it is no wider than a few times their
    number (a round's publications, a round's subscriptions), without the sort `np.unique` makes."""
    if not len(values):
        return 0
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values):
        return len(np.unique(values))
    return int(np.count_nonzero(np.bincount(values - low)))


def last_within(sizes: list[tuple[int, int]], matches: int) -> int:
    """Of feed rows' (seq, bytes of pairs), in seq order, the seq of the row in which `matches`
    matches are reached (the last row when they are not): a read up to it holds about that many
    matches, and at least one row, without any row having been read whole to know."""
    budget = 16 * matches  # bytes: two int64 a match
    return next((seq for seq, size in sizes if (budget := budget - size) <= 0), sizes[-1][0])


def unpack(seq: int, pairs: bytes, cropped: bool = False) -> FeedEntry:
    both = np.frombuffer(pairs, np.int64)
    half = len(both) // 2
    return FeedEntry(seq, both[:half], both[half:], cropped)


def spill_end(entry: FeedEntry, position: int, budget: int) -> int:
    """Where a spill step that starts at `position` of a row with `budget` matches left stops: the
    row's end, or the end of the subscription the budget runs out in (a large row is spilled over
    several steps, whole subscriptions at a time)."""
    end = len(entry.pubs)
    if end - position > budget:
        last = entry.sub_nos[position + max(1, budget) - 1]
        end = int(np.searchsorted(entry.sub_nos, last, side="right"))
    return end


def consumed_floor(rows: list[tuple[int, int]]) -> np.ndarray:
    """Per subscription number, the publication up to which nothing needs queueing, from (number,
    consumed cursor) rows of the live subscriptions; NEVER for numbers with no live subscription
    (among them those of removed subscriptions, whose ids may have been taken again under new numbers)."""
    pairs = np.array(rows, np.int64).reshape(-1, 2)
    floor = np.full(int(pairs[:, 0].max(initial=0)) + 1, NEVER, np.int64)
    floor[pairs[:, 0]] = pairs[:, 1]
    return floor


def unconsumed(sub_nos: np.ndarray, pubs: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Which matches still need a queue row."""
    keep = sub_nos < len(floor)
    keep[keep] = pubs[keep] > floor[sub_nos[keep]]
    return keep


def horizon(processed: int, *oldest_held: int | None) -> int:
    """The highest offset no queue, feed row or stateful subscription still needs (`oldest_held`: the oldest
    publication each of them holds, None when it holds none)."""
    return min([processed] + [oldest - 1 for oldest in oldest_held if oldest is not None])
