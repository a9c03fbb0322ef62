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

TICK = os.sysconf("SC_CLK_TCK")
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
    children = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):  # a JVM starts processes from any of its threads
        with contextlib.suppress(OSError), open(task) as handle:
            children += [int(child) for child in handle.read().split()]
    return total / TICK + sum(cpu_seconds(child) for child in children)


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
