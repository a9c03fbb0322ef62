"""What a test does when something it needs from the machine is missing: it is skipped where that is
expected (a developer's laptop without PostgreSQL), and fails where the variable naming it is 1, as
CI sets every one, so that a skip cannot hide a test CI meant to run."""

import os
from typing import NoReturn

import pytest


def missing(what: str, variable: str) -> NoReturn:
    """Skip the calling test or fixture because `what` is missing, or fail it if `variable`=1."""
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what}, and {variable}=1 requires it")
    pytest.skip(f"{what} (set {variable}=1 to make this a failure)")
