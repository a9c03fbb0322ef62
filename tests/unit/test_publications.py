import orjson
import pytest

from veil.protocol import ProtocolError, flatten, parse_publication, parse_publication_batch


def test_defined_form_converts_by_type():
    raw = b'{"publication": [{"key": "lat", "val": "57", "type": "int"}, {"key": "q", "val": "0.8", "type": "double"},'
    raw += b' {"key": "ok", "val": "true", "type": "boolean"}, {"key": "s", "val": 5, "type": "string"}]}'
    assert orjson.loads(parse_publication(raw).body) == {"lat": 57, "q": 0.8, "ok": True, "s": "5"}


def test_raw_form_is_kept_as_published():
    raw = b'{"OrdAgencyCode": "", "OrdAgencyDescr": "MED FRIGO", "lat": 51.05}'
    assert parse_publication(raw).body == raw


def test_raw_form_with_newlines_becomes_one_line():
    assert parse_publication(b'{"a":\n 1}').body == b'{"a":1}'


def test_row_form_becomes_an_object():
    assert orjson.loads(parse_publication(b'[{"key": "a", "val": 1}, {"key": "b", "val": "x"}]').body) == {"a": 1, "b": "x"}


def test_batch_refuses_all_when_one_line_is_bad():
    assert len(parse_publication_batch(b'{"a": 1}\n\n{"b": 2}\n')) == 2
    with pytest.raises(ProtocolError) as err:
        parse_publication_batch(b'{"a": 1}\n{"b": \n')
    assert err.value.field.startswith("line 2")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", "body"),
        (b"42", "body"),
        (b'"text"', "body"),
        (b'{"publication": []}', "publication"),
        (b'{"publication": [5]}', "publication[0]"),
        (b'{"publication": [{"val": 1}]}', "publication[0].key"),
        (b'{"publication": [{"key": "a"}]}', "publication[0].val"),
        (b'{"publication": [{"key": "a", "val": "x", "type": "int"}]}', "publication[0].val"),
        (b'{"publication": [{"key": "a", "val": 1, "type": "decimal"}]}', "publication[0].type"),
        (b'{"publication": [{"key": "a", "val": 1}, {"key": "a", "val": 2}]}', "publication[1].key"),
        (b'{"publication": [{"key": "a", "val": {"x": 1}}]}', "publication[0].val"),
        (b'{"publication": [{"key": "a", "val": "maybe", "type": "boolean"}]}', "publication[0].val"),
        (b'{"publication": [{"key": "a", "val": "1e999", "type": "float"}]}', "publication[0].val"),
    ],
)
def test_invalid_publications_name_the_field(raw, field):
    with pytest.raises(ProtocolError) as err:
        parse_publication(raw)
    assert err.value.status == 400
    assert err.value.field == field


def test_flatten_paths_and_nulls():
    doc = {"a": {"b": [7, {"c": 1}]}, "n": None, "t": True, "e": {}, "l": []}
    assert flatten(doc) == {"a.b.[0]": 7, "a.b.[1].c": 1, "t": True}
