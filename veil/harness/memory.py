"""A process's resident memory, as the kernel counts it: what the bounded-memory tests and the
idle-connections benchmark hold the gateway to."""

from __future__ import annotations

import threading


def resident(pid: int) -> int:
    """Resident memory in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


class Peak:
    """The most resident memory a process had, sampled every 50 ms from a thread (a peak between two
    reads at the end of a run would be missed otherwise)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.bytes = resident(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.bytes = max(self.bytes, resident(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.bytes
