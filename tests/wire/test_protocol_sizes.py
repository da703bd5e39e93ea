"""The size rules of the wire format: failure text is cut to a bound, and a `hello` answer is read safely."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.errors import InvalidArgument
from cronoq.wire import protocol


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


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.text(max_size=12_000), st.text(max_size=40_000))
def test_the_broker_bounds_a_dones_failure_text_as_a_worker_does(error_type, message, trace):
    done = protocol.Done(protocol.PROTOCOL_VERSION, "t", 1, False, error_type, message, trace)
    bounded = protocol.bounded(done)
    for field, limit in (("error_type", protocol.MAX_ERROR_TYPE_BYTES), ("error_message",
                         protocol.MAX_ERROR_MESSAGE_BYTES), ("traceback", protocol.MAX_TRACEBACK_BYTES)):
        assert len(getattr(bounded, field).encode()) <= limit
        assert getattr(bounded, field) == protocol.clip(getattr(done, field), limit)  # the worker's own cut
    assert (bounded.id, bounded.attempt, bounded.ok) == ("t", 1, False)


def test_a_field_past_its_bound_is_refused_by_name():
    header = protocol.encode(protocol.Ready(protocol.PROTOCOL_VERSION, 3, ["p" * 201], 1))
    with pytest.raises(InvalidArgument, match=r"length <= 200 .*the field `pools` of a `ready`"):
        protocol.read_worker_messages(header, None)
    item = protocol.Status(protocol.PROTOCOL_VERSION, 4, "i" * 257)
    batch = protocol.encode(protocol.RequestBatch(protocol.PROTOCOL_VERSION, [(protocol.Ping(1, 5), None),
                                                                                (item, None)]))
    (ping, _), (refused, _) = protocol.read_client_requests(batch, None)
    assert isinstance(ping, protocol.Ping) and isinstance(refused, protocol.Refused) and refused.rid == 4
    assert "the field `id` of a `status`" in refused.error.message
