"""The MQTT bridge's pure parts: topic templates both ways, a message's publication, and the journal
that gives a redelivered message the key it was published under."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.bridge.inbound import Inbound, document
from veil.bridge.journal import Entry, Journal, digest
from veil.bridge.mqtt_link import Received, broker_address
from veil.bridge.topics import TopicMismatch, TopicTemplate
from veil.client.errors import Forbidden, VeilError
from veil.protocol.publications import keyed, parse_publication, parse_publication_batch

# levels a device may use that render back unchanged (but for `%`, the escape)
LEVEL = st.text(st.characters(blacklist_characters="/+#$", blacklist_categories=("Cs", "Cc", "Cn")), max_size=12)


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


@given(st.lists(LEVEL, min_size=1, max_size=5).filter(lambda levels: "".join(levels)))
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


def test_hostile_values_are_encoded_and_an_impossible_topic_is_refused():
    template = TopicTemplate.parse("{site}/alerts")
    assert template.render({"site": "a\x01b\uffff\x7f"}) == "a%01b%EF%BF%BF%7F/alerts"
    assert template.render({"site": "$SYS"}) == "%24SYS/alerts"  # not the brokers' own topics
    assert TopicTemplate.parse("alerts/{site}").render({"site": "$x"}) == "alerts/$x"
    for publication in ({"site": "x" * 70_000}, {"site": "\U0010fffe"}):
        topic = None
        with contextlib.suppress(TopicMismatch):
            topic = template.render(publication)
        assert topic is None or (len(topic.encode()) <= 65535 and "\U0010fffe" not in topic)
    with pytest.raises(TopicMismatch, match="empty"):
        TopicTemplate.parse("{site}").render({})


def test_a_numeric_level_is_plain_ascii_digits():
    template = TopicTemplate.parse("a/{n:int}/{f:float}")
    assert template.attributes("a/-3/2.5e3") == {"n": -3, "f": 2500.0}
    many = "9" * 5000  # more digits than int() takes: not this template's, the next may fit
    for topic in (
        "a/\u0663/1",
        "a/+3/1",
        "a/ 3/1",
        "a/3_0/1",
        "a/3/1_0",
        "a/3/inf",
        "a/3/nan",
        "a/3/0x1",
        f"a/{many}/1",
    ):
        with pytest.raises(TopicMismatch):
            template.attributes(topic)


def publication(templates, topic, payload, value="value") -> dict:
    return orjson.loads(document(templates, topic, payload, value))


def test_the_topic_wins_over_the_payload_and_values_that_are_no_object_are_kept():
    templates = [TopicTemplate.parse("s/{site}")]
    assert publication(templates, "s/north", b'{"site": "south", "t": 1}') == {"site": "north", "t": 1}
    assert publication(templates, "s/n", b"21.5") == {"value": 21.5, "site": "n"}
    assert publication(templates, "s/n", b"on", "v") == {"v": "on", "site": "n"}
    assert publication(templates, "s/n", b"[1, 2]", "v") == {"v": [1, 2], "site": "n"}
    with pytest.raises(TopicMismatch, match="fits no --topic"):
        document(templates, "t/n", b"{}", "v")


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b"\xff", "neither JSON nor UTF-8"),
        (b'{"a": 1', "malformed JSON"),
        (b'{"a": NaN}', "malformed JSON"),
        (b"[" * 2000 + b"]" * 2000, "nested too deeply"),  # deeper than the decoder goes
        (b'{"a": 123456789012345678901234567890}', "cannot"),  # not silently a float
        (b'{"veil:scope": "ops", "a": 1}', "veil:scope"),  # a device does not choose a scope
        (b'{"veil:key": "k"}', "veil:key"),
        (b" " * ((1 << 20) + 1), "bytes"),
        (b'{"publication": [{"key": "veil:scope", "val": "ops", "type": "string"}]}', "veil:"),  # a defined form
    ],
)
def test_a_payload_that_cannot_be_published_as_sent_is_refused(payload, says):
    with pytest.raises(ValueError, match=says):
        document([TopicTemplate.parse("s/#")], "s/n", payload, "v")


class Link:
    """What Inbound needs of an MQTT connection: its number, whether it resumed, acknowledgements."""

    def __init__(self) -> None:
        self.connection, self.session_resumed, self.acked = 1, True, []

    def resumed(self, connection: int) -> bool:
        return self.session_resumed

    def ack(self, message) -> bool:
        if message.connection != self.connection:
            return False
        self.acked.append(message.mid)
        return True

    def taken(self, messages) -> None:
        pass


class Veil:
    """/publish as the gateway keys it (protocol.publications), each key logged once; `refuse`: a
    status to answer instead, while it is set."""

    def __init__(self) -> None:
        self.log: list[tuple[str, dict]] = []
        self.keys: dict[str, int] = {}
        self.refuse: VeilError | None = None

    async def request(self, path, body, content_type, extra):
        if self.refuse is not None:
            raise self.refuse
        batch = content_type == "application/x-ndjson"
        routed = parse_publication_batch(body) if batch else [parse_publication(body)]
        ids = []
        for one, key in zip(routed, keyed(routed, extra["Idempotency-Key"], batch=batch), strict=True):
            if key not in self.keys:
                self.keys[key] = len(self.log)
                self.log.append((key, orjson.loads(one.body)))
            ids.append(self.keys[key])
        return {"ids": ids} if batch else {"id": ids[0]}


def message(n: int, dup: bool = False, connection: int = 1) -> Received:
    return Received(f"s/{n}", orjson.dumps({"n": n}), 100 + n, 1, dup, connection)


async def test_a_group_sent_again_after_a_reconnect_is_logged_once(tmp_path):
    link, veil = Link(), Veil()
    inbound = Inbound(link, veil, [TopicTemplate.parse("s/{site:int}")], Journal(str(tmp_path / "j")))
    veil_answers = veil.request

    async def answered_then_cut(*args):  # Veil logs the group, and the answer is lost with the connection
        await veil_answers(*args)
        link.connection = 2
        raise aiohttp.ClientConnectionError("cut")

    veil.request = answered_then_cut
    task = asyncio.create_task(inbound.forward([message(1), message(2), message(3)]))
    while link.connection == 1:
        await asyncio.sleep(0.01)
    veil.request = veil_answers
    await task
    assert link.acked == []  # the first connection's messages are not acknowledged on the second
    await inbound.forward([message(1, True, 2), message(2, True, 2), message(3, True, 2), message(4, False, 2)])
    assert [doc["n"] for _, doc in veil.log] == [1, 2, 3, 4]
    assert link.acked == [101, 102, 103, 104]
    assert inbound.counts.repeated == 3


async def test_a_message_held_unwritten_when_the_connection_was_replaced_is_new_when_it_comes_again(tmp_path):
    link, veil = Link(), Veil()
    inbound = Inbound(link, veil, [TopicTemplate.parse("s/{site:int}")], Journal(str(tmp_path / "j")))
    await inbound.forward([message(1)])
    # the same bytes again, under the same packet id (free since it was acknowledged), received and not
    # yet forwarded when the connection was replaced: it comes again, marked DUP, and is a new message
    link.connection = 2
    await inbound.forward([message(1, False, 1)])  # the stale copy, dropped
    await inbound.forward([message(1, True, 2)])
    assert [doc["n"] for _, doc in veil.log] == [1, 1]
    assert inbound.counts.stale == 1


async def test_a_published_message_whose_copies_went_stale_keeps_its_key(tmp_path):
    link, veil = Link(), Veil()
    inbound = Inbound(link, veil, [TopicTemplate.parse("s/{site:int}")], Journal(str(tmp_path / "j")))
    veil_answers = veil.request

    async def answered_then_cut(*args):  # logged; the answer is lost, and the connection replaced twice
        await veil_answers(*args)
        link.connection = 3
        raise aiohttp.ClientConnectionError("cut")

    veil.request = answered_then_cut
    task = asyncio.create_task(inbound.forward([message(1)]))
    while link.connection == 1:
        await asyncio.sleep(0.01)
    veil.request = veil_answers
    await task
    await inbound.forward([message(1, True, 2), message(1, True, 3)])  # a stale copy, then the live one
    assert [doc["n"] for _, doc in veil.log] == [1]
    assert link.acked == [101]


async def test_what_a_lost_session_will_not_send_again_is_forwarded_now(tmp_path):
    link, veil = Link(), Veil()
    inbound = Inbound(link, veil, [TopicTemplate.parse("s/{site:int}")], Journal(str(tmp_path / "j")))
    link.connection, link.session_resumed = 2, False
    await inbound.forward([message(1, False, 1), message(2, False, 2)])
    assert [doc["n"] for _, doc in veil.log] == [1, 2]
    assert link.acked == [102]


async def test_refusals_of_the_publication_are_dropped_and_of_the_bridge_waited_out(tmp_path, monkeypatch):
    monkeypatch.setattr("veil.bridge.inbound.RETRY_FIRST", 0.01)
    link, veil = Link(), Veil()
    inbound = Inbound(link, veil, [TopicTemplate.parse("s/{site:int}")], Journal(str(tmp_path / "j")))
    veil.refuse = Forbidden("veil:scope", "not a member", 403)
    await inbound.forward([message(1)])
    assert (inbound.counts.rejected, link.acked) == (1, [101])
    veil.refuse = Forbidden("authHash", "does not match the certificate", 403)  # the bridge's credential
    task = asyncio.create_task(inbound.forward([message(2)]))
    await asyncio.sleep(0.2)
    assert not task.done() and link.acked == [101]
    veil.refuse = None
    await task
    assert link.acked == [101, 102] and [doc["n"] for _, doc in veil.log] == [2]


def test_a_redelivery_gets_the_key_it_had_and_anything_else_a_new_one(tmp_path):
    path = str(tmp_path / "j" / "bridge.journal")
    journal = Journal(path)
    with pytest.raises(ValueError, match="another bridge"):
        Journal(path)
    a, b = digest("t", b"1"), digest("t", b"2")
    assert journal.keys([Entry(1, a, False), Entry(2, b, False)], ["k1", "k2"]) == [("k1", False), ("k2", False)]
    journal.close()
    journal = Journal(path)  # after the bridge died
    assert journal.keys([Entry(1, a, True)], ["k3"]) == [("k1", True)]  # sent again: its key
    assert journal.keys([Entry(2, a, True)], ["k4"]) == [("k4", False)]  # another message under that id
    assert journal.keys([Entry(1, a, False)], ["k5"]) == [("k5", False)]  # not marked again: a new message
    assert journal.keys([Entry(1, a, True)], ["k6"]) == [("k5", True)]
    journal.forget([1])
    assert journal.keys([Entry(1, a, True)], ["k7"]) == [("k7", False)]  # held unwritten: the DUP is new
    journal.close()


def test_a_password_is_never_printed_however_it_is_spelled():
    for url in ("mqtt://u:s3cret@host:99999", "mqtt://u:s3/cr?et#x@host:99999", "tcp://u:s3cret@host"):
        with pytest.raises(ValueError) as refused:
            broker_address(url)
        assert "s3" not in str(refused.value)
