"""What every store decides alike, so that a dialect adds only its SQL and its connections.

Group commit: the gateway funnels appends through one writer thread (`gateway.ingest`), and a store
commits each list it is given in one transaction, so many concurrent publishes share one fsync.

Matches are queued in two tiers. The pipeline writes each round's matches as one packed feed
row (a few bytes a match, one insert a round); a feed row is the durable queue for every match in it.
Once a row is `SPILL_AFTER` seconds old and the hub has fanned it out, compaction spills the matches
its subscriptions have not yet consumed into per-subscription queue rows, and the feed row can go.
A subscriber that keeps up therefore costs no per-match row at all; one that lags or is away gets a
queue of its own. Publications are monotonic across feed rows (a replayed batch is not written
twice), so a backlog is the spilled rows followed by the unspilled feed.

Compaction runs every `COMPACT_INTERVAL` seconds (up to `COMPACT_IDLE_INTERVAL` while idle) in
steps of about `COMPACT_CHUNK` rows, one transaction each, so it never holds the write locks for
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
FEED_ROW_PAIRS = 1 << 20  # matches per feed row at most
PACKED = -1  # a packed row's first int64 (an unpacked row's is a subscription number: never negative)
# a publication's offset from the row's least, in as many bytes as the row's span needs
PUB_WIDTHS: dict[int, type[np.integer]] = {2: np.uint16, 4: np.uint32, 8: np.int64}
# The fewest and the most bytes of a row a match takes (2: a subscription's many matches; 56: a
# row of one): a read of rows up to a byte budget of FEWEST_MATCH_BYTES a match holds at most that
# many matches (what their columns take unpacked, 16 bytes each, stays bounded), and one of
# MOST_MATCH_BYTES a match holds at least that many (a compaction step fills its share)
FEWEST_MATCH_BYTES = 2
MOST_MATCH_BYTES = 56
FEED_READ_PAIRS = 4 << 20  # matches the hub reads from the feed at once, about (it takes at least a row)
NEVER = np.iinfo(np.int64).max


def feed_rows(sub_nos: np.ndarray, pubs: np.ndarray) -> list[tuple[bytes, int]]:
    """A round's matches as feed rows (`pack`): each row's pairs sorted by (subscription number,
    publication), so that a subscription's matches are one binary search away and spilled rows fill
    the queue index in order, with the oldest publication the row holds. A row holds at most
    FEED_ROW_PAIRS pairs: whatever reads the feed (the gateway's hub, compaction) holds a row whole,
    and one round of many publications matching many subscriptions would otherwise be hundreds of
    megabytes. The rows follow each other in pair order, so a subscription whose matches span two
    rows gets them in publication order."""
    sub_nos, pubs = sorted_pairs(sub_nos, pubs)
    return [
        (pack(sub_nos[low : low + FEED_ROW_PAIRS], pubs[low : low + FEED_ROW_PAIRS]),
         int(pubs[low : low + FEED_ROW_PAIRS].min()))
        for low in range(0, len(pubs), FEED_ROW_PAIRS)
    ]  # fmt: skip


def pack(sub_nos: np.ndarray, pubs: np.ndarray) -> bytes:
    """Sorted pairs as one feed row: a header (PACKED, how many subscriptions, the width of a
    publication, the least publication), each subscription number once and where its matches end,
    then the publications as offsets from the least, in as few bytes as their span needs. A million
    matches over 20,000 subscriptions and 400 publications (a CUPUS round's shape) are 2.4 MiB
    instead of two int64 columns' 16, and SQLite (alone, in a script) wrote such a row in 0.6 ms
    against 22 and read it in 0.6 against 20 (a 16 MiB blob is four thousand overflow pages)."""
    cuts = np.flatnonzero(sub_nos[1:] != sub_nos[:-1]) + 1
    numbers, ends = sub_nos[np.r_[0, cuts]], np.r_[cuts, len(sub_nos)].astype(np.int64)
    low = int(pubs.min())
    span = int(pubs.max()) - low
    width, dtype = next((width, dtype) for width, dtype in PUB_WIDTHS.items() if span <= np.iinfo(dtype).max)
    head = np.array([PACKED, len(numbers), width, low], np.int64)
    return b"".join([head.tobytes(), numbers.tobytes(), ends.tobytes(), (pubs - low).astype(dtype).tobytes()])


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


def uniques(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and each value's index among them (`np.unique` with
    `return_inverse`): by a table over their span when it is no wider than a few times their number
    (a round's publications, which a gateway looks up for a million matches at once), a gather each
    where `np.unique` sorts them all."""
    if not len(values):
        return values, np.empty(0, np.intp)
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values):
        found, index = np.unique(values, return_inverse=True)
        return found, index
    present = np.zeros(high - low + 1, bool)
    present[values - low] = True
    return np.flatnonzero(present) + low, (np.cumsum(present) - 1)[values - low]


def last_within(sizes: list[tuple[int, int]], budget: int) -> int:
    """Of feed rows' (seq, bytes of pairs), in seq order, the seq of the row in which `budget` bytes
    are reached (the last row when they are not): a read up to it holds that many bytes of rows
    give or take a row, and at least one row, without any row having been read whole to know."""
    return next((seq for seq, size in sizes if (budget := budget - size) <= 0), sizes[-1][0])


def unpack(seq: int, pairs: bytes, cropped: bool = False) -> FeedEntry:
    """A feed row's pairs as columns (`pack`)."""
    columns = _columns(pairs)
    if columns is None:  # a row from before rows were packed: two int64 columns
        both = np.frombuffer(pairs, np.int64)
        half = len(both) // 2
        return FeedEntry(seq, both[:half], both[half:], cropped)
    numbers, ends, offsets, low = columns
    sub_nos = np.repeat(numbers, np.diff(ends, prepend=0))
    return FeedEntry(seq, sub_nos, offsets.astype(np.int64) + low, cropped)


def matches_of(pairs: bytes, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The matches a feed row holds for the subscription numbers `wanted`: for each, the index in
    `wanted` of its subscription and its publication, in `wanted`'s order, then publication order.
    Of a packed row only the table of subscriptions and the wanted ones' publications are read: a
    backlog read asks a row of 20,000 subscriptions for a few of them, and `unpack` would spend the
    whole row's size on each (backlog reads were a quarter of a saturated gateway's samples once)."""
    columns = _columns(pairs)
    if columns is None:
        entry = unpack(0, pairs)
        low = np.searchsorted(entry.sub_nos, wanted)
        high = np.searchsorted(entry.sub_nos, wanted, side="right")
        offsets, least = entry.pubs, 0
    else:
        numbers, ends, offsets, least = columns
        if not len(numbers):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        at = np.minimum(np.searchsorted(numbers, wanted), len(numbers) - 1)
        hit = numbers[at] == wanted
        high = np.where(hit, ends[at], 0)
        low = np.where(hit & (at > 0), ends[at - 1], 0)
    sizes = high - low
    whose = np.repeat(np.arange(len(wanted)), sizes)
    spots = np.arange(len(whose)) + np.repeat(low - np.cumsum(sizes) + sizes, sizes)
    return whose, offsets[spots].astype(np.int64) + least


def _columns(pairs: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """A packed row's subscription numbers, where each one's matches end, the publications' offsets
    and the least publication, as views of the row (nothing copied); None for a row from before rows
    were packed."""
    head = np.frombuffer(pairs, np.int64, 4) if len(pairs) >= 32 else None
    if head is None or head[0] != PACKED:
        return None
    count, width, low = int(head[1]), int(head[2]), int(head[3])
    table = np.frombuffer(pairs, np.int64, 2 * count, 32)
    return table[:count], table[count:], np.frombuffer(pairs, PUB_WIDTHS[width], offset=32 + 16 * count), low


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
