"""The decoders hold one invariant: any bytes either decode to a message or raise InvalidArgument."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq import protocol
from cronoq.errors import InvalidArgument

DECODERS = (protocol.decode_client_request, protocol.decode_client_reply,
            protocol.decode_worker_message, protocol.decode_worker_command)
TAGS = ["submit", "wait", "unwait", "status", "cancel", "pause", "resume", "stats", "ping", "accepted", "outcome",
        "info", "ok", "error", "ready", "heartbeat", "done", "leave", "bye", "welcome", "task", "reregister", "left",
        "nope", ""]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=12), st.binary(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                      max_leaves=12)
# Near misses: a real tag and version, then fields of any type, so the decoders' validation runs, not only msgpack's.
near_misses = st.builds(lambda tag, version, fields: msgspec.msgpack.encode([tag, version, *fields]),
                        st.sampled_from(TAGS), st.sampled_from([1, 1, 1, 0, 2, "1", None]), st.lists(values, max_size=9))
headers = st.one_of(st.binary(max_size=64), values.map(msgspec.msgpack.encode), near_misses,
                    st.integers(1, 200_000).map(lambda depth: b"\x91" * depth))  # nesting deeper than any stack


def _decodes_or_refuses(decode, header: bytes) -> None:
    try:
        message = decode(header)
    except InvalidArgument as exc:
        assert exc.code == "INVALID_ARGUMENT" and exc.message
    else:
        assert message.v == protocol.PROTOCOL_VERSION


@settings(max_examples=400, deadline=None)
@given(headers)
def test_any_header_decodes_or_is_invalid_argument(header):
    for decode in DECODERS:
        _decodes_or_refuses(decode, header)
    rid = protocol.peek_rid(header)
    assert isinstance(rid, int)


def test_messages_round_trip_and_old_clients_may_leave_new_trailing_fields_out():
    submit = protocol.Submit(protocol.PROTOCOL_VERSION, 7, "llm", "acme", "high", 30.0, None, "k", 2, "abc-1")
    assert protocol.decode_client_request(protocol.encode(submit)) == submit
    old = msgspec.msgpack.encode(["submit", 1, 7, "llm"])
    assert protocol.decode_client_request(old).submission is None
    ready = msgspec.msgpack.encode(["ready", 1, 1, ["default"], 2])
    assert protocol.decode_worker_message(ready).concurrency is None
