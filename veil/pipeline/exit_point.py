"""The exit point: a round's matches, as `MatchPartition` emits them, recorded in the store.

The matches are written as one feed entry with the partition's processed offset, and the cropped
copies some of them deliver and the deliveries decided by state (top-k/w, initial matches) beside
it, in one transaction; the store recognises a round recorded before by the partition's processed
offset and writes it only once. Entries the round set aside go to the quarantine in the same
transaction.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from veil.pipeline.rows import MARK, QUARANTINE, STATEFUL, decode_quarantined, decode_stateful
from veil.store import KIND_PUBLICATION, PipelineStore, Quarantined


def record_round(store: PipelineStore, table: pa.Table, part: int, took_ms: int, began: int | None = None) -> None:
    """Record a round that matched the log from offset `began` (see `record_deliveries`)."""
    offsets = table.column("offset").to_numpy()
    sub_nos = table.column("sub_no").to_numpy()
    quarantined: list[Quarantined] = []
    is_set_aside = sub_nos == QUARANTINE
    if is_set_aside.any():
        blobs = table.column("copy").filter(is_set_aside).to_pylist()
        quarantined = list({(q.offset, q.sub_id): q for q in map(decode_quarantined, blobs)}.values())
        # a publication the round could not process is delivered by none of its subscriptions
        poisoned = [q.offset for q in quarantined if q.kind == KIND_PUBLICATION]
        dropped = is_set_aside | (np.isin(offsets, poisoned) & (sub_nos >= 0))
        table, offsets, sub_nos = table.filter(~dropped), offsets[~dropped], sub_nos[~dropped]
    is_stateful = sub_nos == STATEFUL
    stateful = None
    if is_stateful.any():
        (blob,) = table.column("copy").filter(is_stateful).to_pylist()  # one per round
        stateful = decode_stateful(blob)
        table, offsets, sub_nos = table.filter(~is_stateful), offsets[~is_stateful], sub_nos[~is_stateful]
    is_mark = sub_nos == MARK
    matches = ~is_mark
    copy = table.column("copy")
    copies = []
    if copy.null_count < len(copy):
        cropped = copy.is_valid().to_numpy(zero_copy_only=False)
        copies = list(
            zip(sub_nos[cropped].tolist(), offsets[cropped].tolist(), copy.filter(cropped).to_pylist(), strict=True)
        )
    store.record_deliveries(
        sub_nos[matches], offsets[matches], int(offsets[is_mark][0]), copies, stateful, quarantined, part, took_ms,
        began,
    )  # fmt: skip

