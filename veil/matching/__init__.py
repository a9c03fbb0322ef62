"""The predicate model, satisfiability and the subscription index. Pure, no I/O, no Spark."""

from veil.matching.index import SubscriptionIndex
from veil.matching.predicates import Predicate, evaluate, matches
from veil.matching.satisfiable import Unsatisfiable, check_satisfiable

__all__ = ["Predicate", "SubscriptionIndex", "Unsatisfiable", "check_satisfiable", "evaluate", "matches"]
