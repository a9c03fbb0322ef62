"""The exit point (foreachBatch on the driver): queue the micro-batch's matches in the store.

Matches are written in publication order, with the processed offset, in one transaction; the store
ignores pairs it already holds, so a batch that Spark replays after a crash delivers nothing twice.
"""

from __future__ import annotations

import pyarrow.compute as pc
from pyspark.sql import DataFrame

from veil.pipeline.stores import store_for


class DeliveryWriter:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.toArrow()
        is_mark = pc.is_null(table.column("sub_id"))
        marks = table.filter(is_mark).column("offset")
        # publication order is all a queue needs; a publication matches a subscription once
        matches = table.filter(pc.invert(is_mark)).sort_by("offset")
        if len(marks):
            store_for(self.url).record_deliveries(
                batch_id,
                matches.column("sub_id").to_pylist(),
                matches.column("offset").to_numpy(),
                pc.max(marks).as_py(),
            )
