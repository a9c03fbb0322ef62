"""CPU seconds spent by each part of a running broker and its load generators, from /proc.

A benchmark that asks which process saturates, and what a delivery costs in each, snapshots the
process tree under each root before and after a step: every process is named by its role (from its
command line) and its user + system time summed per role. Read from /proc rather than with a
profiler so that measuring costs the measured processes nothing; Linux only, as the benchmarks are.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import os
import signal
import threading
from collections.abc import Callable

TICK = os.sysconf("SC_CLK_TCK")
LOOK_EVERY = 0.2  # seconds between a TreeCpu's looks at its tree
SIGCHLD_IGNORED = 1 << (signal.SIGCHLD - 1)  # its bit in /proc/PID/status's SigIgn
ROLES = (  # the first pattern found in a process's command line names its role
    ("pyspark.daemon", "Spark Python workers (matching)"),
    ("python_streaming_source_runner", "Spark driver (Python)"),
    ("plan_data_source_read", "Spark driver (Python)"),
    ("java", "Spark JVM"),
    ("veil.pipeline", "Spark driver (Python)"),
    ("--role pipeline", "Spark driver (Python)"),
    ("veil serve", "gateway"),
    ("veil.cli", "gateway"),
    ("multiprocessing", "load generators"),
)


def _fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (fields[1] is the parent, [11:15] the
    CPU ticks: user, system, then of reaped children), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, None if it is gone or has ended and waits for its parent
    to reap it: such a zombie keeps its CPU figures but not its command line, so its role cannot be
    told, and a process that ended is not counted anyway."""
    fields = _fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds(pid: int | None, descendants: bool = True) -> float:
    """CPU time of a process (and of its descendants, living or reaped), in seconds."""
    fields = None if pid is None else _fields(pid)
    if fields is None:
        return 0.0
    own = int(fields[11]) + int(fields[12])
    if not descendants:
        return own / TICK
    total = own + int(fields[13]) + int(fields[14])
    return total / TICK + sum(cpu_seconds(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    """A process's living children, started from any of its threads (as a JVM starts them)."""
    children: list[int] = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError), open(task) as handle:
            children += [int(child) for child in handle.read().split()]
    return children


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((role for pattern, role in ROLES if pattern in command), "other")


def snapshot(roots: list[int]) -> dict[str, float]:
    """CPU seconds so far by role, over the processes under `roots` (themselves included)."""
    stats = {pid: stat for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if (stat := _stat(pid))}
    children = collections.defaultdict(list)
    for pid, (parent, _) in stats.items():
        children[parent].append(pid)
    seen: set[int] = set()
    todo = [root for root in roots if root in stats]
    totals: dict[str, float] = collections.defaultdict(float)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        totals[_role(pid)] += stats[pid][1]
        todo.extend(children[pid])
    return dict(totals)


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by role between two snapshots (processes that ended meanwhile are not counted)."""
    return {role: max(0.0, after.get(role, 0.0) - before.get(role, 0.0)) for role in sorted(after)}


class TreeCpu:
    """CPU seconds of a process tree so far, processes that ended included, followed from a thread.

    A process that ends is counted in its parent's figures (`cpu_seconds`) once the parent reaps it,
    but not where the parent ignores SIGCHLD: the kernel then reaps it, and its CPU is counted
    nowhere. PySpark's daemon does, so each Python worker that ended during a measurement (a data
    source's planning, a worker Spark let go) took its CPU away from the pipeline's total, which
    came out negative. So this looks at the tree every LOOK_EVERY seconds and keeps the last figures
    of each process it saw end that no parent it follows counts; a process that left the tree
    (its parent ended and it was adopted elsewhere) is still followed. What a process spent after
    its last look, or in a life shorter than LOOK_EVERY, is not counted where its parent ignores
    SIGCHLD."""

    def __init__(self, root: Callable[[], int | None]) -> None:
        self._root = root  # (looked up each time: a supervised process may be started again)
        # (pid, start time) -> (parent pid, CPU ticks with its reaped children's, whether it ignores SIGCHLD)
        self._seen: dict[tuple[int, int], tuple[int, int, bool]] = {}
        self._ended = 0  # ticks of processes that ended and that no followed process counts
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="tree-cpu", daemon=True)
        self._thread.start()

    def __call__(self) -> float:
        with self._lock:
            return self._look() / TICK

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        while not self._stop.wait(LOOK_EVERY):
            with self._lock:
                self._look()

    def _look(self) -> int:
        living: dict[tuple[int, int], tuple[int, int, bool]] = {}
        root = self._root()
        todo: list[tuple[int, int | None]] = [*self._seen, *([(root, None)] if root is not None else [])]
        while todo:  # (pid, its start time if it was seen before)
            pid, started = todo.pop()
            if (figures := _figures(pid, started)) is None or figures[0] in living:
                continue
            key, parent, ticks, ignores = figures
            living[key] = (parent, ticks, ignores)
            todo += [(child, None) for child in _children(pid)]
        ended = {key: seen for key, seen in self._seen.items() if key not in living}
        # a parent read before it reaped a child seen gone is read again: the kernel adds the child's
        # CPU to its parent's before the child leaves /proc
        keys = {key[0]: key for key in living}
        for parent in {keys[parent] for parent, _, _ in ended.values() if parent in keys}:
            if (figures := _figures(*parent)) is not None:
                living[parent] = figures[1:]
        living_by_pid = {pid: living[key] for pid, key in keys.items()}
        ended_by_pid = {key[0]: seen for key, seen in ended.items()}
        answers: dict[int, bool] = {}

        def counts_children(pid: int) -> bool:
            """Whether what the children a process reaps spent is counted: it reaps them (does not
            ignore SIGCHLD) and lives, or ended as well and was reaped by one that counts its own."""
            if pid in living_by_pid:
                return not living_by_pid[pid][2]
            if pid not in answers:
                answers[pid] = False  # (until known: a loop of parents counts nothing twice)
                gone = ended_by_pid.get(pid)
                answers[pid] = gone is not None and not gone[2] and counts_children(gone[0])
            return answers[pid]

        self._ended += sum(ticks for parent, ticks, _ in ended.values() if not counts_children(parent))
        self._seen = living
        return self._ended + sum(ticks for _, ticks, _ in living.values())


def _figures(pid: int, started: int | None = None) -> tuple[tuple[int, int], int, int, bool] | None:
    """((pid, start time), parent, CPU ticks with its reaped children's, whether it ignores SIGCHLD) of
    a process, None if it is gone or its pid now names another process than the one `started` then."""
    fields = _fields(pid)
    if fields is None or started not in (None, int(fields[19])):
        return None
    return (pid, int(fields[19])), int(fields[1]), sum(int(ticks) for ticks in fields[11:15]), _ignores_sigchld(pid)


def _ignores_sigchld(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as file:
            line = next(line for line in file if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(line.split()[1], 16) & SIGCHLD_IGNORED)
