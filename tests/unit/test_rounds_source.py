import time
from concurrent.futures import ThreadPoolExecutor, wait

from tests.unit.helpers import published, stream_reader
from veil.matching.stored import encode_subscription
from veil.pipeline import job, partition_task, worker_state
from veil.pipeline.matcher import Matcher
from veil.pipeline.partition_task import BEAT, SILENT_MS, PartitionTask, round_end
from veil.pipeline.rounds import EpochReader, EventLogSource
from veil.pipeline.store_handle import store_for
from veil.store import open_store


def test_rounds_shrink_to_the_matches_the_last_one_produced():
    assert round_end(100, 1000, 50, 60, 0) == 150  # nothing seen yet: the row limit
    assert round_end(100, 1000, 50, 60, 20) == 103  # 20 matches per entry: 3 entries make ~60
    assert round_end(100, 1000, 50, 60, 500) == 101  # never below one entry
    assert round_end(100, 102, 50, 60, 0) == 102  # never past the head


def test_every_trigger_starts_the_next_epoch_with_a_task_per_partition(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).cut_epoch(lost=True)
    reader = stream_reader(EventLogSource, store=url, partitions="3", epochSeconds="7", partitionMode="publications")
    assert isinstance(reader, EpochReader) and reader.by_publication
    assert reader.initialOffset() == {"epoch": 0}
    assert reader.latestOffset({"epoch": 41}, None) == {"epoch": 42}  # type: ignore[arg-type]
    before = time.time()
    leases = reader.partitions({"epoch": 41}, {"epoch": 42})
    assert [(lease.task.task, lease.task.tasks) for lease in leases] == [(0, 3), (1, 3), (2, 3)]
    (deadline,) = {lease.deadline for lease in leases}  # one for the epoch, however late a task starts
    assert before + 7 <= deadline <= time.time() + 7
    assert {lease.cuts for lease in leases} == {(1, 1)}  # a cut from before it is not its own


def test_with_fewer_cores_than_partitions_each_task_runs_several_from_the_start(tmp_path):
    """Not one task per partition, some of them waiting for a core until a running one adopts
    their partitions by silence: as many tasks as cores, each claiming its share when it starts."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url)
    for slots, expected in (("1", 1), ("2", 2), ("8", 3)):
        reader = stream_reader(EventLogSource, store=url, partitions="3", slots=slots)
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


def test_with_publication_partitioning_a_top_k_w_subscription_is_set_aside_by_every_partition(tmp_path):
    """One that predates a switch to publication partitioning: each partition would rank its own
    slice of the log, so every partition sets it aside alike (loading or meeting it), saying why,
    and the other subscriptions are matched as before."""
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.set_partitions(2)
    ranked = encode_subscription([["a", "ge", 0]], topk=(1, 60_000, [["a", 1.0, None, "high"]]))
    old = store.put_subscription("ranked", "alice", ranked)
    store.put_subscription("plain", "bob", encode_subscription([["a", "ge", 0]]))
    (pub,) = store.append_publications(published(b'{"a":1}'))
    new = store.put_subscription("later", "carol", ranked)
    end = store.head_offset()
    matcher = Matcher(url, 2, True, with_authorization=False)
    for part, (start, until) in enumerate([(0, pub), (pub, end)]):
        worker_state.discard(matcher.state_key(part))  # each in a worker of its own
        done = matcher.round(store_for(url), part, start, until)
        assert {q.sub_id for q in done.quarantined} == ({"ranked"} if part == 0 else {"ranked", "later"})
        assert {q.error for q in done.quarantined} == {
            "Unranked: top-k/w subscriptions need the pipeline's --partition-mode subscriptions"
        }
        assert list(done.pubs) == ([pub] if part == 0 else []) and old < pub < new
    again = store.put_subscription("later", "carol", ranked)  # refused whole: the state is not rebuilt for it
    (last,) = store.append_publications(published(b'{"a":2}'))
    done = matcher.round(store_for(url), 0, end, last)
    assert not done.built and {q.offset for q in done.quarantined} == {again} and list(done.pubs) == [last]


def test_with_publication_partitioning_a_worker_holds_one_state_for_every_partition(tmp_path):
    """Each partition holds every subscription: the state one partition's range left is caught up
    to the next range whichever partition's it is, so a worker that runs several builds one."""
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.set_partitions(3)
    store.put_subscription("plain", "bob", encode_subscription([["a", "ge", 0]]))
    offsets = store.append_publications(published(*[b'{"a":%d}' % i for i in range(6)]))
    matcher = Matcher(url, 3, True, with_authorization=False)
    rounds = [matcher.round(store_for(url), part, start, end) for part, start, end in [
        (0, 0, offsets[1]), (1, offsets[1], offsets[3]), (2, offsets[3], offsets[5]),
    ]]  # fmt: skip
    assert [done.built for done in rounds] == [True, False, False] and worker_state.held(url, 3) == {0}
    task = PartitionTask(matcher, 1, 2, 100, 1000)
    assert task._warm() == [0, 1, 2]  # any partition's state is at hand
    task._claim(store_for(url), 1000, task._warm())
    assert task.parts == [0, 1] and worker_state.held(url, 3) == {0}


def test_the_driver_says_which_partitions_have_no_running_task(tmp_path, monkeypatch, caplog):
    """A partition whose sign of life has not changed for as long as tasks wait before adopting it,
    by the driver's clock, is reported dark (store, log) until it beats again."""
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.set_partitions(2)
    store.register_pipeline(1)
    clock = [1000.0]
    monkeypatch.setattr(job.time, "monotonic", lambda: clock[0])
    heartbeat = job.Heartbeat(store, 2, tasks=True)
    store.partition_beat([0, 1])
    heartbeat.beat()
    clock[0] += 3.0
    time.sleep(0.002)  # a beat is a millisecond clock's value: make it another one
    store.partition_beat([0])
    heartbeat.beat()
    assert store.pipeline_status().dark == ()
    clock[0] += 2.5  # partition 1 silent 5.5 s, partition 0 2.5 s
    with caplog.at_level("INFO", logger="veil.pipeline"):
        heartbeat.beat()
        assert store.pipeline_status().dark == (1,)
        time.sleep(0.002)  # a beat is a millisecond clock's value: make it another one
        store.partition_beat([1])
        heartbeat.beat()
    assert store.pipeline_status().dark == ()
    assert "matcher partition 1 has no running task (no sign of life for 5.5 s)" in caplog.text
    assert "matcher partition 1 runs again" in caplog.text
    quiet = job.Heartbeat(store, 2, tasks=False)  # the micro-batch trigger: no tasks to say dark
    quiet.beat()
    clock[0] += 10.0
    quiet.beat()
    assert store.pipeline_status().dark == ()


def test_an_epoch_cut_when_executors_join_ends_at_once(tmp_path):
    """The driver saw an executor join: the epoch's tasks end within a look around instead of at
    the deadline, so the next epoch places tasks on it; one planned after the cut is not cut."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(2)
    store = store_for(url)
    cuts = store.epoch_cuts()
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(_task(url, i, 2).run, time.time() + 60, cuts) for i in range(2)]
        time.sleep(1.0)
        cut = time.monotonic()
        store.cut_epoch(lost=False)
        wait(running, timeout=10)
        assert all(future.done() for future in running) and time.monotonic() - cut <= 2 * BEAT + 1
        later = time.time()
        pool.submit(_task(url, 0, 1).run, later + 1.5, store.epoch_cuts()).result(timeout=10)
        assert time.time() >= later + 1.5  # planned after the cut: it ran to its deadline


def test_an_epoch_cut_when_executors_are_lost_does_not_wait_for_the_lost_task(tmp_path):
    """A task whose executor was lost started its lease and will never end it; its retry needs a
    core the others hold. After the driver's cut they stop waiting for it once its partition is
    silent for SILENT_MS (or adopted), instead of running until the retry gets a core; the retry,
    planned before the cut, ends at once with what its first attempt claimed."""
    url = f"sqlite:///{tmp_path}/veil.db"
    open_store(url).set_partitions(3)
    store = store_for(url)
    cuts, deadline = store.epoch_cuts(), time.time() + 60
    lost = _task(url, 2, 3, 3)
    lost._claim(store, int(deadline * 1000), range(3))  # its lease started, then its executor was lost
    with ThreadPoolExecutor(2) as pool:
        began = time.monotonic()
        running = [pool.submit(_task(url, i, 3, 3).run, deadline, cuts) for i in range(2)]
        time.sleep(1.0)
        store.cut_epoch(lost=True)
        wait(running, timeout=15)
        took = time.monotonic() - began
        assert all(future.done() for future in running) and took <= SILENT_MS / 1000 + 4 * BEAT + 1, took
        retry = _task(url, 2, 3, 3)
        retried = time.monotonic()
        retry.run(deadline, cuts)
        assert retry.parts == lost.parts and time.monotonic() - retried < 2 * BEAT + 1


def test_a_round_is_paced_only_while_publications_come_fast(tmp_path, monkeypatch):
    """At a low rate a commit that lands while a round runs goes in the next round at once; once the
    partition's rounds took in PACED_RATE entries a second, the next waits for the round gap, and
    it goes at once again when the rate has fallen."""
    monkeypatch.setattr(partition_task, "RATE_WINDOW", 0.5)
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    store.put_subscription("plain", "bob", encode_subscription([["a", "ge", 0]]))
    task = PartitionTask(Matcher(url, 1, False, with_authorization=False), 0, 1, 1000, 100000, round_gap=2.0)
    handle = store_for(url)
    handle.own_partition(0, 7)

    def round_after(publications: int) -> float:
        store.append_publications(published(*[b'{"a":1}'] * publications))
        began = time.monotonic()
        task._head = handle.wait_for_log(0, 0)  # what the task's loop does between rounds
        assert task._round(handle, 0, 7) is None  # recorded
        return time.monotonic() - began

    task._head = handle.wait_for_log(0, 0)
    assert task._round(handle, 0, 7) is None and task._round(handle, 0, 7) is not None  # the state built
    assert round_after(1) < 1.0
    assert round_after(1) < 1.0  # a commit during the last round: not paced
    assert round_after(partition_task.PACED_RATE) < 1.0  # the rate is known once this round is in
    assert round_after(1) > 1.0  # fast: paced
    time.sleep(0.6)  # the fast rounds leave the window
    assert round_after(1) < 1.0
