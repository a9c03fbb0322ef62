"""The stateful subscription kinds there are: a kind is added by adding its module's `KIND` here."""

from veil.matching.kinds.base import Kind
from veil.matching.kinds.topkn import KIND as COUNT_WINDOWS
from veil.matching.kinds.topkw import KIND as TIME_WINDOWS

KINDS: tuple[Kind, ...] = (TIME_WINDOWS, COUNT_WINDOWS)
