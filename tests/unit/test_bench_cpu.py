"""The benchmarks' CPU accounting of a process tree: a worker that ended under a parent ignoring
SIGCHLD (as PySpark's daemon does) keeps its CPU in the tree's total instead of taking it away."""

from __future__ import annotations

import glob
import subprocess
import sys
import time

from bench.cpu import TreeCpu, cpu_seconds

# a parent that ignores SIGCHLD, and a child that spends 0.6 s of CPU and ends, reaped by the kernel
PARENT = """
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if os.fork() == 0:
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    os._exit(0)
time.sleep(60)
"""


def children(pid: int) -> list[str]:
    found: list[str] = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with open(task) as handle:
            found += handle.read().split()
    return found


def test_a_child_the_kernel_reaped_still_counts_in_its_tree() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    tree = TreeCpu(lambda: parent.pid)
    try:
        deadline = time.monotonic() + 30
        while not children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        while children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not children(parent.pid), "the child did not end"
        assert cpu_seconds(parent.pid) < 0.3  # what the parent's own figures say: the child's CPU is lost
        counted = tree()
        assert counted >= 0.35  # the child's, up to its last look (every 0.2 s), and the parent's
        time.sleep(0.3)
        assert tree() >= counted  # and it stays counted
    finally:
        tree.close()
        parent.kill()
        parent.wait()
