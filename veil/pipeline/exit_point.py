"""The exit point (foreachBatch on the driver): queue the micro-batch's matches in the store.

The matches are written as one feed entry with the processed offset, and the cropped copies some of
them deliver and the top-k/w output beside it, in one transaction; the store
recognises a batch that Spark replays after a crash by its processed offset and writes it only once.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from veil.pipeline.match import MARK, TOPK, decode_topk
from veil.pipeline.stores import store_for
from veil.store import TopKBatch


class DeliveryWriter:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.toArrow()
        offsets = table.column("offset").to_numpy()
        sub_nos = table.column("sub_no").to_numpy()
        is_mark = sub_nos == MARK
        if is_mark.any():
            is_topk = sub_nos == TOPK
            topk = None
            if is_topk.any():
                topk = _merged([decode_topk(blob) for blob in table.column("copy").filter(is_topk).to_pylist()])
                table, offsets, sub_nos = table.filter(~is_topk), offsets[~is_topk], sub_nos[~is_topk]
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
            store_for(self.url).record_deliveries(
                batch_id, sub_nos[matches], offsets[matches], int(offsets[is_mark].max()), copies, topk
            )


def _merged(parts: list[TopKBatch]) -> TopKBatch | None:
    """The partitions' top-k/w output as one: each subscription lives in one partition, so its
    deliveries keep their order."""
    if not parts:
        return None
    held = [p.held for p in parts if p.held is not None]
    due = [p.due for p in parts if p.due is not None]
    return TopKBatch(
        [d for p in parts for d in p.deliveries],
        [b for p in parts for b in p.bands],
        min(held) if held else None,
        min(due) if due else None,
    )
