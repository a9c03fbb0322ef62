"""The benchmarks' CPU accounting of a process tree: a worker that ended under a parent ignoring
SIGCHLD (as PySpark's daemon does) keeps its CPU in the tree's total instead of taking it away, and
one its parent reaped is counted once."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

from bench.cpu import TreeCpu, _children, cpu_seconds

# a parent, and a child that spends 0.6 s of CPU, idles (so that a look sees all it spent) and ends:
# reaped by the kernel where the parent ignores SIGCHLD, else by the parent
PARENT = """
import os, signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
child = os.fork()
if child == 0:
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    time.sleep(0.5)
    os._exit(0)
if sys.argv[1] == "reap":
    os.waitpid(child, 0)
time.sleep(60)
"""


@contextlib.contextmanager
def ended_child(how: str) -> Iterator[tuple[subprocess.Popen, TreeCpu]]:
    """A parent whose child has spent its CPU and ended, and the tree followed from the start."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how])
    tree = TreeCpu(lambda: parent.pid)
    try:
        deadline = time.monotonic() + 30
        while not _children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        while _children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _children(parent.pid), "the child did not end"
        yield parent, tree
    finally:
        tree.close()
        parent.kill()
        parent.wait()


def test_a_child_the_kernel_reaped_still_counts_in_its_tree() -> None:
    with ended_child("ignore") as (parent, tree):
        assert cpu_seconds(parent.pid) < 0.3  # what the parent's own figures say: the child's CPU is lost
        counted = tree()
        assert counted >= 0.55  # the child's, seen while it idled, and the parent's
        time.sleep(0.3)
        assert tree() >= counted  # and it stays counted


def test_a_child_its_parent_reaped_counts_once() -> None:
    with ended_child("reap") as (parent, tree):
        assert cpu_seconds(parent.pid) >= 0.55  # in the parent's figures
        assert 0.55 <= tree() < 0.95  # and not again from the child's last look
