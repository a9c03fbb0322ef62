"""The gateway's heap trims: one for a burst of closing connections, and never more often than
TRIM_INTERVAL however often clients come and go (each trim holds the event loop)."""

import asyncio

from veil.gateway import memory


class Libc:
    def __init__(self) -> None:
        self.trims: list[float] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(asyncio.get_running_loop().time())
        return 1


async def test_a_burst_of_closes_trims_once_and_churn_trims_at_most_once_per_interval(monkeypatch):
    libc = Libc()
    monkeypatch.setattr(memory, "_LIBC", libc)
    monkeypatch.setattr(memory, "TRIM_DELAY", 0.05)
    monkeypatch.setattr(memory, "TRIM_INTERVAL", 0.5)
    monkeypatch.setattr(memory, "_last", -1.0)
    monkeypatch.setattr(memory, "_trim", None)  # one pending on the loop of an earlier in-process gateway
    began = asyncio.get_running_loop().time()
    for _ in range(100):
        memory.give_back()
    await asyncio.sleep(0.2)
    assert len(libc.trims) == 1 and libc.trims[0] - began >= 0.05
    deadline = began + 2.0
    last_close = began
    while last_close < deadline:  # a client comes and goes every 10 ms
        memory.give_back()
        last_close = asyncio.get_running_loop().time()
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.6)  # the trim after the last close comes
    gaps = [later - earlier for earlier, later in zip(libc.trims, libc.trims[1:], strict=False)]
    assert 3 <= len(libc.trims) <= 6 and min(gaps) >= 0.5 - 0.01
    assert libc.trims[-1] >= last_close  # and one came after the last close
