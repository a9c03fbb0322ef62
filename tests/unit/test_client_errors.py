"""The client's errors: one class per kind of answer, readable from any body the broker sends."""

from veil.client import errors
from veil.protocol import ProtocolError


def test_an_error_document_becomes_the_class_of_its_status():
    error = errors.error_from_body(403, b'{"error": "belongs to another client", "field": "subscriptionId", "status": 403}')
    assert isinstance(error, errors.Forbidden) and isinstance(error, errors.FATAL)
    assert (error.status, error.field, error.problem) == (403, "subscriptionId", "belongs to another client")
    assert str(error) == "403 subscriptionId: belongs to another client"
    assert isinstance(error, ProtocolError)  # the protocol's error, as the client receives it


def test_overload_is_not_fatal_and_an_unreadable_body_still_reports_its_status():
    overloaded = errors.error_from_body(503, b'{"error": "busy", "field": "", "status": 503}')
    assert isinstance(overloaded, errors.Overloaded) and not isinstance(overloaded, errors.FATAL)
    garbled = errors.error_from_body(502, b"<html>bad gateway</html>")
    assert type(garbled) is errors.VeilError and (garbled.status, garbled.problem) == (502, "<html>bad gateway</html>")
    assert str(garbled) == "502 <html>bad gateway</html>"
