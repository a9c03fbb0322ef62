import time

from tests.unit.helpers import stream_reader
from veil.pipeline.partition_task import round_end
from veil.pipeline.rounds import EpochReader, EventLogSource


def test_rounds_shrink_to_the_matches_the_last_one_produced():
    assert round_end(100, 1000, 50, 60, 0) == 150  # nothing seen yet: the row limit
    assert round_end(100, 1000, 50, 60, 20) == 103  # 20 matches per entry: 3 entries make ~60
    assert round_end(100, 1000, 50, 60, 500) == 101  # never below one entry
    assert round_end(100, 102, 50, 60, 0) == 102  # never past the head


def test_every_trigger_starts_the_next_epoch_with_a_task_per_partition():
    reader = stream_reader(EventLogSource, partitions="3", epochSeconds="7", partitionMode="publications")
    assert isinstance(reader, EpochReader) and reader.by_publication
    assert reader.initialOffset() == {"epoch": 0}
    assert reader.latestOffset({"epoch": 41}, None) == {"epoch": 42}  # type: ignore[arg-type]
    before = time.time()
    leases = reader.partitions({"epoch": 41}, {"epoch": 42})
    assert [lease.task.parts for lease in leases] == [[0], [1], [2]]
    (deadline,) = {lease.deadline for lease in leases}  # one for the epoch, however late a task starts
    assert before + 7 <= deadline <= time.time() + 7


def test_with_fewer_cores_than_partitions_each_task_runs_several_from_the_start():
    """Not one task per partition, some of them waiting for a core until a running one adopts
    their partitions by silence."""
    for slots, expected in (("1", [[0, 1, 2]]), ("2", [[0, 2], [1]]), ("8", [[0], [1], [2]])):
        reader = stream_reader(EventLogSource, partitions="3", slots=slots)
        assert isinstance(reader, EpochReader)
        assert [lease.task.parts for lease in reader.partitions({"epoch": 0}, {"epoch": 1})] == expected
