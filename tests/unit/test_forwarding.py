"""Secret forwarding's subscriber side without brokers: copies arrive from n brokers in any order,
some missing, some altered; every publication opens once with the right payload while at most
n - k brokers misbehave, and the altered shares are reported."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.client import forwarding
from veil.client.forwarding import ForwardedStream, ForwardingPublisher, split_publication
from veil.protocol.reserved import FORWARD
from veil.security import shamir


def altered(document: dict) -> dict:
    """The copy a lying broker forwards: its share's value changed."""
    fields = dict(document[FORWARD])
    share = shamir.Share.from_bytes(base64.b64decode(fields["share"]))
    fields["share"] = base64.b64encode(share._replace(value=(share.value + 1) % shamir.PRIME).to_bytes()).decode()
    return {**document, FORWARD: fields}


def opened(stream: ForwardedStream) -> list:
    out = []
    while not stream._out.empty():
        out.append(stream._out.get_nowait())
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 5), st.integers(0, 2), st.data())
def test_any_k_honest_copies_open_it_and_wrong_shares_are_reported(k, extra, data):
    n = 2 * k - 1 + extra
    payload = data.draw(st.binary(max_size=64))
    documents = split_publication({"lat": 1.5, "id": "t-1"}, payload, k, n)
    misbehaving = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n - k))
    liars = {b for b in misbehaving if data.draw(st.booleans())}  # the others are down
    order = data.draw(st.permutations(range(n)))
    stream = ForwardedStream([], k)
    for broker in order:
        if broker in misbehaving and broker not in liars:
            continue
        stream.take(broker, altered(documents[broker]) if broker in liars else documents[broker])
    [publication] = opened(stream)
    assert publication.payload == payload
    assert publication.attributes == {"lat": 1.5, "id": "t-1"}
    assert not set(publication.brokers) & liars
    assert {broker for _, broker in stream.corrupted} == liars  # each wrong share, once it arrived


def test_fewer_than_k_honest_shares_open_nothing():
    documents = split_publication({"n": 1}, b"secret", 2, 3)
    stream = ForwardedStream([], 2)
    stream.take(0, documents[0])
    stream.take(1, altered(documents[1]))
    stream.take(2, altered(documents[2]))
    assert opened(stream) == []


def test_a_copy_is_taken_once_per_broker_and_junk_is_ignored():
    documents = split_publication({"n": 1}, b"secret", 2, 3)
    stream = ForwardedStream([], 2)
    stream.take(0, documents[0])
    stream.take(0, documents[1])  # a second copy through the same broker counts once
    stream.take(1, {"n": 1, FORWARD: {"id": documents[0][FORWARD]["id"], "share": "??"}})
    stream.take(1, {"plain": True})
    assert opened(stream) == []
    stream.take(2, documents[2])
    [publication] = opened(stream)
    assert publication.payload == b"secret" and publication.brokers == (0, 2)
    assert not stream.corrupted  # an unreadable copy counts as dropped, not as a wrong share


def test_a_lying_copy_that_comes_first_cannot_stand_in_for_the_honest_ones():
    """Its attributes, parameters and sealed payload are its own: the honest copies still open, with
    their attributes, and its share is reported."""
    documents = split_publication({"n": 1}, b"secret", 2, 3)
    forged = altered(documents[2])
    forged = {**forged, "n": 2, FORWARD: {**forged[FORWARD], "n": 2, "sealed": base64.b64encode(b"x" * 40).decode()}}
    stream = ForwardedStream([], 2)
    stream.take(2, forged)
    stream.take(0, documents[0])
    stream.take(1, documents[1])
    [publication] = opened(stream)
    assert (publication.payload, publication.attributes, publication.brokers) == (b"secret", {"n": 1}, (0, 1))
    assert publication.corrupted == (2,)
    stream.take(1, {**documents[1], FORWARD: {**documents[1][FORWARD], "k": -1}})  # parameters it cannot use
    assert opened(stream) == []


@pytest.mark.parametrize(("k", "n"), [(1, 3), (0, 3), (2, 2), (3, 4), (2, 300)])
def test_thresholds_that_defeat_forwarding_are_refused(k, n):
    """k = 1: every broker holds the key; n < 2k - 1: k - 1 misbehaving brokers leave fewer than k."""
    with pytest.raises(ValueError, match=r"k is at least 2|n >= 2k - 1"):
        split_publication({"n": 1}, b"secret", k, n)
    with pytest.raises(ValueError, match=r"k is at least 2|n >= 2k - 1"):
        ForwardingPublisher([None] * n, k)  # type: ignore[list-item]  # refused before any broker is used


def test_a_copy_made_for_another_k_is_reported():
    documents = split_publication({"n": 1}, b"secret", 3, 5)
    stream = ForwardedStream([], 2)
    stream.take(4, documents[4])
    assert list(stream.mismatched) == [(documents[4][FORWARD]["id"], 4, 3)] and opened(stream) == []


def test_a_broker_flooding_invented_ids_evicts_only_its_own_copies(monkeypatch):
    """With (2, 3), broker 2 invents forwarding ids between the honest copies of every publication:
    each publication still opens from brokers 0 and 1."""
    monkeypatch.setattr(forwarding, "MAX_PENDING", 50)
    stream = ForwardedStream([], 2)
    publications = [split_publication({"n": i}, b"%d" % i, 2, 3) for i in range(20)]
    for i, documents in enumerate(publications):
        stream.take(0, documents[0])
        for j in range(200):  # more than every budget: what broker 0 holds must stay
            invented = split_publication({"n": -1}, b"junk", 2, 3)[2]
            stream.take(2, {**invented, FORWARD: {**invented[FORWARD], "id": f"invented-{i}-{j}"}})
        stream.take(1, documents[1])
    assert [p.payload for p in opened(stream)] == [b"%d" % i for i in range(20)]
    assert len(stream._pending[(2, None)].ids) <= 50 and len(stream._gatherings) <= 50 + 20


def test_a_publisher_flooding_through_an_honest_broker_evicts_only_its_own_copies(monkeypatch):
    """Junk forwarded under mallory's name fills mallory's budget at broker 0, not alice's."""
    monkeypatch.setattr(forwarding, "MAX_PENDING_BYTES", 1 << 20)
    stream = ForwardedStream([], 2)
    documents = split_publication({"n": 1}, b"real", 2, 3)
    stream.take(0, documents[0], "alice")
    for _ in range(20):
        junk = split_publication({"n": -1}, b"x" * 100_000, 2, 3)[0]
        stream.take(0, junk, "mallory")
    stream.take(1, documents[1], "mallory")  # a lying broker's copy under another name: not alice's
    assert opened(stream) == []
    stream.take(2, documents[2], "alice")
    [publication] = opened(stream)
    assert (publication.payload, publication.publisher) == (b"real", "alice")


def test_a_broker_inventing_publishers_holds_no_more_than_its_bound(monkeypatch):
    """Each invented name would otherwise get a budget of its own: memory without end."""
    monkeypatch.setattr(forwarding, "MAX_PENDING", 10)
    stream = ForwardedStream([], 2)
    invented = split_publication({"n": -1}, b"junk", 2, 3)[2]
    for j in range(500):
        stream.take(2, {**invented, FORWARD: {**invented[FORWARD], "id": f"i{j}"}}, f"nobody-{j}")
    held = sum(len(g.copies) for g in stream._gatherings.values())
    assert held == len(stream._by_broker[2].ids) == forwarding.BROKER_PUBLISHERS * 10
    assert len(stream._pending) == forwarding.BROKER_PUBLISHERS * 10  # no empty budgets left behind


def test_an_opened_publication_keeps_only_its_shares():
    """A broker that never forwards its copy must not make the subscriber keep the others'."""
    stream = ForwardedStream([], 2)
    for i in range(20):
        documents = split_publication({"n": i}, b"x" * 100_000, 2, 3)
        stream.take(0, documents[0])
        stream.take(1, documents[1])
    assert len(opened(stream)) == 20
    kept = stream._gatherings.values()
    assert all(not g.copies and len(g.opened.sealed) == 0 for g in kept) and len(kept) == 20


def test_a_copy_that_comes_again_after_its_publication_opened_opens_nothing_more():
    documents = split_publication({"n": 1}, b"secret", 2, 3)
    stream = ForwardedStream([], 2)
    for broker in (0, 1, 2):
        stream.take(broker, documents[broker])
    assert len(opened(stream)) == 1
    for broker in (0, 1):  # sent again, after a reconnect or by a broker replaying
        stream.take(broker, documents[broker])
    assert opened(stream) == [] and stream._gatherings == {}


def test_an_opened_publication_tells_its_time_and_whether_its_copy_was_signed_by_a_trusted_key():
    documents = split_publication({"n": 1}, b"secret", 2, 3)
    stream = ForwardedStream([], 2)
    stream.take(0, documents[0], "alice", verified=True)
    stream.take(1, documents[1], "alice", verified=True)
    [publication] = opened(stream)
    assert publication.verified and publication.publisher == "alice"
    assert publication.time == documents[0][FORWARD]["time"] > 0
    replayed = {**documents[2], FORWARD: {**documents[2][FORWARD], "time": 1}}  # an old copy passed off as new
    stream = ForwardedStream([], 2)
    stream.take(0, replayed, "alice")
    stream.take(1, {**documents[1], FORWARD: {**documents[1][FORWARD], "time": 1}}, "alice")
    assert opened(stream) == []  # the time is sealed in: no copy with another time opens


@pytest.mark.parametrize("liar", [0, 2])
def test_a_copy_altered_beside_a_true_share_does_not_stop_the_publication(liar):
    """The liar forwards its true share and the true seal but another time: the shares that fail
    against its copy must still be tried against the publisher's."""
    documents = split_publication({"kind": "x"}, b"secret", 2, 3)
    altered_copy = {**documents[liar], FORWARD: {**documents[liar][FORWARD], "time": documents[liar][FORWARD]["time"] + 1}}
    stream = ForwardedStream([], 2)
    for broker in (liar, *(b for b in range(3) if b != liar)):
        stream.take(broker, altered_copy if broker == liar else documents[broker], "pub")
    [publication] = opened(stream)
    assert publication.payload == b"secret"
