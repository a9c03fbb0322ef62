import threading
import time

from tests.unit.helpers import stream_reader
from veil.pipeline import partition_task, worker_state
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


def test_an_epochs_tasks_claim_the_partitions_their_workers_hold(tmp_path, monkeypatch):
    """Spark gave task 0 the worker that holds partition 1's state: it runs partition 1, and task 1
    (whose worker holds partition 0's) runs 0, however late it starts; neither builds the other's."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(2)
    holds = {0: set(), 1: {0}}  # task 0's worker holds nothing: it waits for task 1 to claim
    monkeypatch.setattr(worker_state, "held", lambda _url, _n: holds[int(threading.current_thread().name)])
    claimed: dict[int, list[int]] = {}

    def start(task: int) -> threading.Thread:
        def claim() -> None:
            claimed[task] = _task(url, task, 2)._claim(store_for(url), 1000, time.time() + 30)

        thread = threading.Thread(target=claim, name=str(task))
        thread.start()
        return thread

    first = start(0)
    time.sleep(0.3)
    start(1).join()
    first.join()
    assert claimed == {0: [1], 1: [0]}


def test_a_task_whose_partners_are_slow_to_start_claims_its_share_and_no_more(tmp_path, monkeypatch):
    """A partner still waiting for a core (or for its Python worker) claims its own share when it
    comes; one that never comes leaves its partitions to be adopted by their silence."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(3)
    monkeypatch.setattr(partition_task, "ARRIVAL_WAIT", 0.2)
    monkeypatch.setattr(worker_state, "held", lambda _url, _n: set())
    assert _task(url, 1, 2, 3)._claim(store_for(url), 1000, time.time() + 30) == [0, 1]
    assert _task(url, 0, 2, 3)._claim(store_for(url), 1000, time.time() + 30) == [2]
