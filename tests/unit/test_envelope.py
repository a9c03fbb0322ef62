"""The envelope's wire format, from both ends."""

import orjson

from veil.protocol.envelope import Origin, fields, published_bytes, wrap


def test_a_signed_publication_round_trips_byte_for_byte():
    body = b'{"a": "x\\"publication\\":1", "b": [1, 2]}'
    line = wrap(7, body, fields(Origin("fleet", "k1", "c2lnbmF0dXJl")))
    assert orjson.loads(line) == {
        "seq": 7, "id": "7", "publisher": "fleet", "keyId": "k1", "signature": "c2lnbmF0dXJl",
        "publication": orjson.loads(body),
    }  # fmt: skip
    assert published_bytes(line + b"\n") == body


def test_copies_keep_the_original_id_and_cropped_ones_lose_only_the_signature():
    copy = Origin("fleet", "k1", "c2ln", copy_of=3)
    assert orjson.loads(wrap(9, b"{}", fields(copy))) == {
        "seq": 9, "id": "3", "publisher": "fleet", "keyId": "k1", "signature": "c2ln", "publication": {},
    }  # fmt: skip
    cropped = orjson.loads(wrap(9, b"{}", fields(copy._replace(cropped=True))))
    assert cropped == {"seq": 9, "id": "3", "publisher": "fleet", "cropped": True, "publication": {}}
    assert orjson.loads(wrap(4, b"{}", fields(Origin(cropped=True)))) == {
        "seq": 4, "id": "4", "cropped": True, "publication": {},
    }  # fmt: skip
    assert wrap(5, b"{}", fields(Origin())) == b'{"seq":5,"id":"5","publication":{}}'
