"""The stateful subscription kinds there are: a kind is added by adding its module's `KIND` here."""

from veil.matching.kinds import topkn, topkw
from veil.matching.kinds.base import Kind

KINDS: tuple[Kind, ...] = (topkw.KIND, topkn.KIND)
