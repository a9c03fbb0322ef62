from pyspark.sql.streaming.datasource import ReadMaxRows

from tests.unit.helpers import published
from veil.pipeline.source import EventLogReader
from veil.store import open_store


def test_batches_shrink_to_the_matches_the_last_one_produced(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.put_subscription("s", "alice", b"[]")
    pubs = store.append_publications(published(*[b"{}"] * 100))
    reader = EventLogReader({"store": url, "maxRowsPerBatch": "50", "maxMatchesPerBatch": "60"})
    start = {"offset": 0}
    assert reader.latestOffset(start, ReadMaxRows(50)) == {"offset": 50}  # nothing seen yet: the row limit
    # a batch of 10 entries that produced 200 matches: 20 per entry, so 3 entries make the next batch
    store.record_deliveries(0, [store.subscription_number("s")] * 200, [pubs[0]] * 200, pubs[9])
    assert reader.latestOffset({"offset": pubs[9]}, ReadMaxRows(50)) == {"offset": pubs[9] + 3}
    # a batch without matches (subscriptions only, say) leaves the estimate as it was
    store.record_deliveries(1, [], [], pubs[12])
    assert reader.latestOffset({"offset": pubs[12]}, ReadMaxRows(50)) == {"offset": pubs[12] + 3}
    # never below one entry, never past the head
    store.record_deliveries(2, [store.subscription_number("s")] * 500, [pubs[13]] * 500, pubs[13])
    assert reader.latestOffset({"offset": pubs[13]}, ReadMaxRows(50)) == {"offset": pubs[13] + 1}
    assert reader.latestOffset({"offset": pubs[-1]}, ReadMaxRows(50)) == {"offset": pubs[-1]}
    store.close()
