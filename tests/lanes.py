"""How the suite shares two pytest-xdist workers (`-n 2` in pyproject.toml's addopts).

A worker takes a whole test module at a time, so that a module's broker (a module-scoped fixture)
starts once, not once per worker. The integration modules that time latencies and faults against
bounds (a partition's calm latency, a fair share for a reader beside a hostile one) make one lane,
queued first, that a single worker runs in turn: at most one other module runs beside each of them,
at first one of the in-process modules (tests/gateway, tests/unit: one core at most, no Spark),
which come next in the queue. The other integration modules come last, taken by whichever worker
is free.

xdist's own `--dist loadgroup` cannot do this: it marks a test's group in its node id, which
pytest 9.2 no longer reads back."""

from __future__ import annotations

from pathlib import PurePath, PurePosixPath

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

TIMED = "timed"
# the integration modules whose assertions are times: they run one after another in their lane
TIMED_MODULES = frozenset(
    {
        "test_pipeline_faults.py",
        "test_isolation_fairness.py",
        "test_operations.py",
        "test_hostile.py",
        "test_isolation_registry.py",
        "test_backpressure.py",
    }
)


def _timed(module: PurePath) -> bool:
    return module.parent.name == "integration" and module.name in TIMED_MODULES


def scope(nodeid: str) -> str:
    """The unit of work a worker takes: the timed lane, or one module."""
    module = PurePosixPath(nodeid.split("::", 1)[0])
    return TIMED if _timed(module) else str(module)


def rank(item: pytest.Item) -> int:
    """Where a module's tests go in the queue the workers take work from."""
    if _timed(item.path):
        return 0
    return 2 if item.path.parent.name == "integration" else 1


class Lanes(LoadScopeScheduling):
    """xdist's per-scope scheduling with the scopes above (in the order of the collection: addopts
    has `--no-loadscope-reorder`)."""

    def _split_scope(self, nodeid: str) -> str:
        return scope(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Lanes:
    return Lanes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=rank)  # stable: each module's tests keep their order
