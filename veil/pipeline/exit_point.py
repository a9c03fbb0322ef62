"""The exit point (foreachBatch on the driver): queue the micro-batch's matches in the store.

The matches are written as one feed entry with the processed offset, and the cropped copies some of
them deliver beside it, in one transaction; the store
recognises a batch that Spark replays after a crash by its processed offset and writes it only once.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from veil.pipeline.match import MARK
from veil.pipeline.stores import store_for


class DeliveryWriter:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.toArrow()
        offsets = table.column("offset").to_numpy()
        sub_nos = table.column("sub_no").to_numpy()
        is_mark = sub_nos == MARK
        if is_mark.any():
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
                batch_id, sub_nos[matches], offsets[matches], int(offsets[is_mark].max()), copies
            )
