"""The micro-batch trigger's parts that run without Spark: a Round's trip from an executor to the
driver, and how a batch's range is shared among the matcher partitions."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.helpers import published, stream_reader
from veil.pipeline.micro_batch import LogRanges, RangeReader, decode_round, encode_round
from veil.pipeline.store_handle import store_for
from veil.store import Quarantined, Round, StatefulBatch, open_store

offsets = st.integers(0, 2**62)
deliveries = st.lists(st.tuples(offsets, offsets, st.none() | st.binary(max_size=20)), max_size=4)
statefuls = st.none() | st.builds(
    StatefulBatch,
    deliveries,
    deliveries,
    st.lists(st.tuples(offsets, st.none() | st.binary(max_size=20)), max_size=4),
    st.none() | offsets,
    st.none() | offsets,
)
quarantines = st.lists(
    st.builds(
        Quarantined,
        offsets,
        st.integers(0, 6),
        st.none() | st.text(max_size=8),
        st.none() | st.text(max_size=8),
        st.text(max_size=30),
    ),
    max_size=3,
)


@given(
    st.lists(st.tuples(offsets, offsets), max_size=50),
    st.lists(st.tuples(offsets, offsets, st.binary(max_size=30)), max_size=5),
    statefuls,
    quarantines,
    st.integers(0, 63),
    offsets,
    offsets,
    st.none() | st.integers(0, 10**6),
    st.booleans(),
)
def test_a_round_arrives_on_the_driver_as_it_left_the_executor(
    pairs, copies, stateful, quarantined, part, start, end, took, built
):
    done = Round(
        np.array([n for n, _ in pairs], np.int64), np.array([p for _, p in pairs], np.int64), end, copies, stateful,
        quarantined, part, took, start, built=built,
    )  # fmt: skip
    back = decode_round(encode_round(done))
    assert back.sub_nos.tolist() == done.sub_nos.tolist() and back.pubs.tolist() == done.pubs.tolist()
    assert back._replace(sub_nos=None, pubs=None) == done._replace(sub_nos=None, pubs=None)


def test_subscription_partitioning_gives_every_partition_the_whole_range(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.append_publications(published(*[b"{}"] * 30))
    store.set_partitions(3)
    for part in range(3):
        assert store.record_round(Round([], [], 10, part=part, start=0))
    reader = stream_reader(LogRanges, store=url, partitions="3")
    assert isinstance(reader, RangeReader)
    assert [(r.part, r.start, r.end) for r in reader.partitions({"offset": 10}, {"offset": 20})] == [
        (0, 10, 20), (1, 10, 20), (2, 10, 20),
    ]  # fmt: skip


def _progress_at(url: str, offset: int) -> None:
    """A store whose one (publication partitioning) progress is at `offset`."""
    store = store_for(url)
    store.set_partitions(1)
    recorded = store.partition_offset(0)
    if offset > recorded:
        assert store.record_round(Round([], [], offset, part=0, start=recorded))


def test_publication_partitioning_slices_what_is_left_to_match_in_order(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).append_publications(published(*[b"{}"] * 30))
    reader = stream_reader(LogRanges, store=url, partitions="3", partitionMode="publications", maxRowsPerRound="7")
    assert isinstance(reader, RangeReader) and reader.max_rows == 7
    _progress_at(url, 10)
    ranges = [(r.start, r.end) for r in reader.partitions({"offset": 10}, {"offset": 20})]
    assert ranges[0][0] == 10 and ranges[-1][1] == 20
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous, no overlap
    assert [(r.start, r.end) for r in reader.partitions({"offset": 10}, {"offset": 11})] == [
        (10, 10),
        (10, 11),
        (11, 11),
    ]
    # the store ahead of Spark's start (the other trigger matched further): only what is left
    _progress_at(url, 16)
    assert [(r.start, r.end) for r in reader.partitions({"offset": 10}, {"offset": 19})] == [
        (16, 17), (17, 18), (18, 19),
    ]  # fmt: skip
    # a checkpoint ahead of the store (a store restored from a backup): from the store's progress
    assert [(r.start, r.end) for r in reader.partitions({"offset": 25}, {"offset": 28})] == [
        (16, 20), (20, 24), (24, 28),
    ]  # fmt: skip
