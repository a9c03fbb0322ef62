"""The canonical JSON of RFC 8785: whichever way it is written (orjson for the common documents,
the rfc8785 library otherwise), the bytes are the library's, or both refuse."""

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.protocol.canonical import canonical

KEYS = st.text(alphabet=st.sampled_from(["a", "B", "é", "\ue000", "\uffff", "\U0001f600", "\x00", '"', "1"]), max_size=4)
LEAVES = (
    st.none() | st.booleans() | st.text(max_size=6)
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1.0, -0.0, 0.0, 1e21, 1e20, 1e16, 2.5e-7, 1e-6, 1.5e-6, 1e-5, 0.1, 5e-324])
)  # fmt: skip
DOCS = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=10)


@settings(max_examples=2000, deadline=None)
@given(DOCS)
def test_canonical_is_the_rfc8785_form(doc):
    try:
        expected = rfc8785.dumps(doc)
    except rfc8785.CanonicalizationError:
        expected = None
    try:
        written = canonical(doc)
    except ValueError:
        written = None
    assert written == expected
