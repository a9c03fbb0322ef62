from veil.gateway.edge import could_serve
from veil.matching import Predicate

ANNOUNCED = [Predicate("sensor", "eq", "NO2"), Predicate("lat", "between", [45, 46])]


def test_a_subscription_is_served_when_some_publication_satisfies_both():
    assert could_serve(ANNOUNCED, [Predicate("lat", "gt", 45.5)], None)
    assert could_serve(ANNOUNCED, [], None)
    assert could_serve(ANNOUNCED, [Predicate("temp", "lt", 0)], None)  # a key the edge did not announce
    assert not could_serve(ANNOUNCED, [Predicate("lat", "lt", 40)], None)
    assert not could_serve(ANNOUNCED, [Predicate("sensor", "eq", "CO")], None)


def test_with_authorization_one_of_the_subscribers_rules_must_fit_too():
    wanted = [Predicate("lat", "gt", 45.5)]
    assert not could_serve(ANNOUNCED, wanted, [])  # no rule: the subscriber may receive nothing
    assert not could_serve(ANNOUNCED, wanted, [[("sensor", "eq", "CO")]])
    assert could_serve(ANNOUNCED, wanted, [[("sensor", "eq", "CO")], [("lat", "le", 45.9)]])
