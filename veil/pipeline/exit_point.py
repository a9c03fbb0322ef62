"""The exit point (foreachBatch on the driver): queue the micro-batch's matches in the store.

The matches are written as one feed entry with the processed offset, and the cropped copies some of
them deliver and the deliveries decided by state (top-k/w, initial matches) beside it, in one transaction; the store
recognises a batch that Spark replays after a crash by its processed offset and writes it only once.
Entries a match task set aside go to the quarantine in the same transaction.
"""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame

from veil.monitoring import trace
from veil.pipeline.rows import MARK, QUARANTINE, STATEFUL, decode_quarantined, decode_stateful
from veil.pipeline.store_handle import store_for
from veil.store import KIND_PUBLICATION, Quarantined, StatefulBatch


class DeliveryWriter:
    def __init__(self, url: str) -> None:
        self.url = url
        self._recorded = 0  # the end of the last batch recorded (for the trace)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.toArrow()
        offsets = table.column("offset").to_numpy()
        sub_nos = table.column("sub_no").to_numpy()
        quarantined: list[Quarantined] = []
        is_set_aside = sub_nos == QUARANTINE
        if is_set_aside.any():
            blobs = table.column("copy").filter(is_set_aside).to_pylist()
            quarantined = list({(q.offset, q.sub_id): q for q in map(decode_quarantined, blobs)}.values())
            # a publication one partition could not process is delivered by none
            poisoned = [q.offset for q in quarantined if q.kind == KIND_PUBLICATION]
            dropped = is_set_aside | (np.isin(offsets, poisoned) & (sub_nos >= 0))
            table, offsets, sub_nos = table.filter(~dropped), offsets[~dropped], sub_nos[~dropped]
        is_mark = sub_nos == MARK
        if is_mark.any():
            is_stateful = sub_nos == STATEFUL
            stateful = None
            if is_stateful.any():
                blobs = table.column("copy").filter(is_stateful).to_pylist()
                stateful = _merged([decode_stateful(blob) for blob in blobs])
                table, offsets, sub_nos = table.filter(~is_stateful), offsets[~is_stateful], sub_nos[~is_stateful]
                is_mark = sub_nos == MARK
            matches = ~is_mark
            copy = table.column("copy")
            copies = []
            if copy.null_count < len(copy):
                cropped = copy.is_valid().to_numpy(zero_copy_only=False)
                copies = list(
                    zip(
                        sub_nos[cropped].tolist(),
                        offsets[cropped].tolist(),
                        copy.filter(cropped).to_pylist(),
                        strict=True,
                    )
                )
            end = int(offsets[is_mark].max())
            store_for(self.url).record_deliveries(
                batch_id, sub_nos[matches], offsets[matches], end, copies, stateful, quarantined
            )
            trace.mark("recorded", self._recorded, end)
            self._recorded = end


def _merged(parts: list[StatefulBatch]) -> StatefulBatch | None:
    """The partitions' stateful output as one: each subscription lives in one partition, so its
    deliveries keep their order."""
    if not parts:
        return None
    held = [p.held for p in parts if p.held is not None]
    due = [p.due for p in parts if p.due is not None]
    return StatefulBatch(
        [d for p in parts for d in p.deliveries],
        [i for p in parts for i in p.initials],
        [b for p in parts for b in p.bands],
        min(held) if held else None,
        min(due) if due else None,
    )
