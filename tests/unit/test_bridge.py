"""The MQTT bridge's pure parts: topic templates both ways, a message's publication, and the journal
that gives a redelivered message the key it was published under."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.bridge.inbound import document
from veil.bridge.journal import Entry, Journal, digest
from veil.bridge.topics import TopicMismatch, TopicTemplate

LEVEL = st.text(st.characters(blacklist_characters="/+#\x00", blacklist_categories=("Cs",)), max_size=12)


def test_a_template_names_levels_and_converts_them():
    template = TopicTemplate.parse("sensors/{site}/{floor:int}/+/{t:float}/#")
    assert template.filter == "sensors/+/+/+/+/#"
    assert template.attributes("sensors/berth-4/3/any/-1.5/x/y") == {"site": "berth-4", "floor": 3, "t": -1.5}
    for topic in ("sensors/b/three/a/1", "sensors/b/3/a", "other/b/3/a/1", "sensors/b/3/a/nan", "sensors/b/3/a/inf"):
        with pytest.raises(TopicMismatch):
            template.attributes(topic)
    with pytest.raises(TopicMismatch):
        TopicTemplate.parse("a/{x}").attributes("a/b/c")  # no # at the end: no more levels


@pytest.mark.parametrize("text", ["", "a/#/b", "a/b#", "a/{x}/{x}", "a/{x:date}", "a/{1x}", "a/+b", "a/{x"])
def test_a_template_that_cannot_work_is_refused(text):
    with pytest.raises(ValueError, match="topic template"):
        TopicTemplate.parse(text)


@given(st.lists(LEVEL, min_size=1, max_size=5))
def test_levels_read_from_a_topic_come_back_as_that_topic(levels):
    names = [f"l{i}" for i in range(len(levels))]
    template = TopicTemplate.parse("/".join(f"{{{n}}}" for n in names))
    attributes = template.attributes("/".join(levels))
    assert attributes == dict(zip(names, levels, strict=True))
    assert template.render(attributes) == "/".join(levels).replace("%", "%25")


@given(st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.integers())))
def test_no_attribute_value_climbs_out_of_its_level_or_makes_a_wildcard(value):
    topic = TopicTemplate.parse("alerts/{site}/end").render({"site": value})
    levels = topic.split("/")
    assert len(levels) == 3 and levels[0] == "alerts" and levels[2] == "end"
    assert not {"+", "#", "\x00"} & set(topic)


def test_the_topic_wins_over_the_payload_and_values_that_are_no_object_are_kept():
    templates = [TopicTemplate.parse("s/{site}")]
    assert document(templates, "s/north", b'{"site": "south", "t": 1}', "value") == {"site": "north", "t": 1}
    assert document(templates, "s/n", b"21.5", "value") == {"value": 21.5, "site": "n"}
    assert document(templates, "s/n", b"on", "v") == {"v": "on", "site": "n"}
    assert document(templates, "s/n", b"[1, 2]", "v") == {"v": [1, 2], "site": "n"}
    with pytest.raises(ValueError, match="neither JSON nor UTF-8"):
        document(templates, "s/n", b"\xff", "v")
    with pytest.raises(TopicMismatch, match="fits no --topic"):
        document(templates, "t/n", b"{}", "v")


def test_a_redelivery_gets_the_key_it_had_and_anything_else_a_new_one(tmp_path):
    path = str(tmp_path / "j" / "bridge.journal")
    journal = Journal(path)
    a, b = digest("t", b"1"), digest("t", b"2")
    assert journal.keys([Entry(1, a, False), Entry(2, b, False)], ["k1", "k2"]) == [("k1", False), ("k2", False)]
    journal.close()
    journal = Journal(path)  # after the bridge died
    assert journal.keys([Entry(1, a, True)], ["k3"]) == [("k1", True)]  # sent again: its key
    assert journal.keys([Entry(2, a, True)], ["k4"]) == [("k4", False)]  # another message under that id
    assert journal.keys([Entry(1, a, False)], ["k5"]) == [("k5", False)]  # not marked again: a new message
    assert journal.keys([Entry(1, a, True)], ["k6"]) == [("k5", True)]
    journal.close()
