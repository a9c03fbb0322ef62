"""Stateful subscription kinds as plug-ins (SPEC §5): each is one module behind `Kind` (`base`),
listed in `registry`; `KindStates` holds one matcher's stateful subscriptions, whatever their kinds."""

from veil.matching.kinds.base import Arrivals, Kind, KindState, NumericColumns, Selected
from veil.matching.kinds.registry import KINDS
from veil.matching.kinds.states import KindStates, UnknownKind

__all__ = ["KINDS", "Arrivals", "Kind", "KindState", "KindStates", "NumericColumns", "Selected", "UnknownKind"]
