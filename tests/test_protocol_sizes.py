"""The size rules of the wire format: failure text is cut to a bound, and a `hello` answer is read safely."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq import protocol


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000), st.integers(48, 4000))
def test_clip_keeps_text_that_fits_and_cuts_the_rest_to_the_limit(text, limit):
    clipped = protocol.clip(text, limit)
    size = len(clipped.encode())  # always encodes: msgpack carries it
    assert size <= limit
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        assert clipped.encode() == data
    else:
        head, rest = clipped.split("\n... [", 1)
        cut, tail = rest.split(" bytes cut] ...\n", 1)
        assert data.startswith(head.encode()) and data.endswith(tail.encode())
        assert len(head.encode()) + int(cut) + len(tail.encode()) == len(data)


def test_clip_keeps_both_ends_of_a_long_traceback():
    trace = "Traceback (most recent call last):\n" + "  File x, line 1\n" * 10_000 + "ValueError: boom\n"
    clipped = protocol.clip(trace, protocol.MAX_TRACEBACK_BYTES)
    assert clipped.startswith("Traceback") and clipped.endswith("ValueError: boom\n")
    assert "bytes cut" in clipped and len(clipped.encode()) <= protocol.MAX_TRACEBACK_BYTES


def test_a_lone_surrogate_cannot_make_a_failure_unsendable():
    assert protocol.encode(protocol.clip("bad \udc80 text", 100)) == protocol.encode("bad ? text")


def test_the_hello_answer_names_the_limit_and_odd_answers_name_none():
    assert protocol.advertised_limit(protocol.hello_value(4096)) == 4096
    for odd in (None, 1, [], {}, {"max_payload_bytes": "1"}, {"max_payload_bytes": True},
                {"max_payload_bytes": 0}, {"max_payload_bytes": -5}):
        assert protocol.advertised_limit(odd) is None
