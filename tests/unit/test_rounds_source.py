import time

from tests.unit.helpers import stream_reader
from veil.pipeline import worker_state
from veil.pipeline.matcher import Matcher
from veil.pipeline.partition_task import PartitionTask, round_end
from veil.pipeline.rounds import EpochReader, EventLogSource
from veil.pipeline.store_handle import store_for
from veil.store import open_store


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
    assert [(lease.task.task, lease.task.tasks) for lease in leases] == [(0, 3), (1, 3), (2, 3)]
    (deadline,) = {lease.deadline for lease in leases}  # one for the epoch, however late a task starts
    assert before + 7 <= deadline <= time.time() + 7


def test_with_fewer_cores_than_partitions_each_task_runs_several_from_the_start():
    """Not one task per partition, some of them waiting for a core until a running one adopts
    their partitions by silence: as many tasks as cores, each claiming its share when it starts."""
    for slots, expected in (("1", 1), ("2", 2), ("8", 3)):
        reader = stream_reader(EventLogSource, partitions="3", slots=slots)
        assert isinstance(reader, EpochReader)
        leases = reader.partitions({"epoch": 0}, {"epoch": 1})
        assert [(lease.task.task, lease.task.tasks) for lease in leases] == [(i, expected) for i in range(expected)]


def _task(url: str, task: int, tasks: int, partitions: int = 2) -> PartitionTask:
    return PartitionTask(Matcher(url, partitions, False), task, tasks, 100, 1000)


def test_an_epochs_tasks_claim_the_partitions_their_workers_hold(tmp_path):
    """Spark gave task 0 the worker that holds partition 1's state and task 1 the one that holds
    partition 0's: each claims what its worker holds first, then its share of the rest (none left
    here), so neither builds the other's; a task whose worker holds nothing gets what is left."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(3)
    store = store_for(url)
    first, second, third = _task(url, 0, 3, 3), _task(url, 1, 3, 3), _task(url, 2, 3, 3)
    third._claim(store, 1000, [])  # a new worker: it came first, with nothing to claim yet
    first._claim(store, 1000, [1])
    second._claim(store, 1000, [0])
    for task in (first, second, third):
        task._claim(store, 1000, range(3))
    assert (first.parts, second.parts, third.parts) == ([1], [0], [2])


def test_a_task_keeps_only_the_states_of_the_partitions_it_claimed(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(2)
    task = _task(url, 0, 1)
    for part in (0, 1):
        worker_state.checkin((url, 2, part), worker_state.State(None, False), 0)
    worker_state.checkin((url, 3, 0), worker_state.State(None, False), 0)  # before the partitions changed
    assert worker_state.held(url, 2) == {0, 1}
    task._claim(store_for(url), 1000, [1])
    assert task.parts == [1]  # its share is both, but it wanted only the one it holds
    assert worker_state.held(url, 2) == {1} and worker_state.held(url, 3) == set()
