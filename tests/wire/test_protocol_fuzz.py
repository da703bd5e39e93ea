"""The decoders hold one invariant: any bytes either decode to a message or raise InvalidArgument."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.errors import InvalidArgument
from cronoq.wire import protocol

DECODERS = (protocol.decode_client_request, protocol.decode_client_reply,
            protocol.decode_worker_message, protocol.decode_worker_command)
TAGS = ["submit", "wait", "unwait", "status", "cancel", "pause", "resume", "stats", "ping", "hello", "accepted", "outcome",
        "info", "ok", "error", "ready", "heartbeat", "done", "leave", "bye", "welcome", "task", "reregister", "left",
        "batch", "nope", ""]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=12), st.binary(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                      max_leaves=12)
# Near misses: a real tag and version, then fields of any type, so the decoders' validation runs, not only msgpack's.
near_misses = st.builds(lambda tag, version, fields: msgspec.msgpack.encode([tag, version, *fields]),
                        st.sampled_from(TAGS), st.sampled_from([1, 1, 1, 0, 2, "1", None]), st.lists(values, max_size=9))
# Batches of near misses: the items' own validation runs inside the batch's.
near_miss_items = st.builds(lambda tag, fields, body: [[tag, 1, *fields], body],
                            st.sampled_from(TAGS), st.lists(values, max_size=6), st.one_of(st.none(), st.binary(max_size=8)))
near_miss_batches = st.builds(lambda version, items: msgspec.msgpack.encode(["batch", version, items]),
                              st.sampled_from([1, 1, 2]), st.lists(near_miss_items | values, max_size=4))
headers = st.one_of(st.binary(max_size=64), values.map(msgspec.msgpack.encode), near_misses, near_miss_batches,
                    st.integers(1, 200_000).map(lambda depth: b"\x91" * depth))  # nesting deeper than any stack


def _decodes_or_refuses(decode, header: bytes) -> None:
    try:
        message = decode(header)
    except InvalidArgument as exc:
        assert exc.code == "INVALID_ARGUMENT" and exc.message
    else:
        assert message.v == protocol.PROTOCOL_VERSION


READERS = (protocol.read_client_requests, protocol.read_client_replies,
           protocol.read_worker_messages, protocol.read_worker_commands)


def _reads_or_refuses(read, header: bytes, body: bytes | None) -> None:
    """A reader gives (message or Refused, body) pairs, every message of the protocol's version, or raises
    InvalidArgument for the message as a whole."""
    try:
        items = read(header, body)
    except InvalidArgument as exc:
        assert exc.code == "INVALID_ARGUMENT" and exc.message
        return
    for item, item_body in items:
        assert item_body is None or isinstance(item_body, bytes)
        if isinstance(item, protocol.Refused):
            assert isinstance(item.rid, int) and item.error.code == "INVALID_ARGUMENT" and item.error.message
        else:
            assert item.v == protocol.PROTOCOL_VERSION


@settings(max_examples=400, deadline=None)
@given(headers, st.one_of(st.none(), st.binary(max_size=4)))
def test_any_header_decodes_or_is_invalid_argument(header, body):
    for decode in DECODERS:
        _decodes_or_refuses(decode, header)
    for read in READERS:
        _reads_or_refuses(read, header, body)
    rid = protocol.peek_rid(header)
    assert isinstance(rid, int)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(TAGS), st.sampled_from([1, 1, 1, 2, "1"]), st.lists(values, max_size=6),
              st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=3))),
    values), max_size=8))
def test_a_batch_is_read_item_by_item_and_each_refusal_keeps_its_rid(items):
    """Whatever its items, a well-formed batch reads as one entry per item, in order: the item, or its refusal
    under the rid its header shows (its third element, an integer, unless the tag is one without a rid)."""
    rids = iter(range(1, 1000))
    wire = []
    expected_rids = []
    for item in items:
        if isinstance(item, tuple):
            tag, version, fields, body = item
            rid = next(rids)
            wire.append([[tag, version, rid, *fields], body])
            expected_rids.append(0 if tag in protocol.RIDLESS_TAGS else rid)
        else:
            wire.append(item)
            expected_rids.append(None)  # anything goes, as long as it reads or is refused
    header = msgspec.msgpack.encode(["batch", 1, wire])
    for read in READERS:
        got = read(header, None)
        assert len(got) == len(wire)
        for (message, _), rid in zip(got, expected_rids):
            if isinstance(message, protocol.Refused) and rid is not None:
                assert message.rid == rid
            elif rid:
                assert message.rid == rid


def test_messages_round_trip_and_old_clients_may_leave_new_trailing_fields_out():
    submit = protocol.Submit(protocol.PROTOCOL_VERSION, 7, "llm", "acme", "high", 30.0, None, "k", 2, "abc-1")
    assert protocol.decode_client_request(protocol.encode(submit)) == submit
    old = msgspec.msgpack.encode(["submit", 1, 7, "llm"])
    assert protocol.decode_client_request(old).submission is None
    ready = msgspec.msgpack.encode(["ready", 1, 1, ["default"], 2])
    assert protocol.decode_worker_message(ready).concurrency is None
    welcome = msgspec.msgpack.encode(["welcome", 1, 1, 1.0, 3])
    assert protocol.decode_worker_command(welcome).max_payload_bytes is None


def _carried(frames: list[bytes], decode) -> list[tuple]:
    """The (message, body) pairs one packed message stands for, as a receiver reads them."""
    message = decode(frames[0])
    if type(message) in (protocol.ReplyBatch, protocol.RequestBatch):
        assert len(frames) == 1, "a batch has no body frame"
        return list(message.items)
    return [(message, frames[1] if len(frames) > 1 else None)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**31), st.one_of(st.none(), st.binary(max_size=3000))), min_size=1, max_size=40),
       st.sampled_from([256, 2048, 32 * 1024]))
def test_pack_carries_every_message_in_order_within_the_size_limit(replies, limit):
    items = [(protocol.Ok(protocol.PROTOCOL_VERSION, rid, "x" * (rid % 50)), body) for rid, body in replies]
    packed = protocol.pack(protocol.ReplyBatch, items, limit)
    received = []
    for frames, carried in packed:
        if carried > 1:  # several go as one batch frame, which always fits; one alone goes as it is
            assert len(frames) == 1 and len(frames[0]) <= limit
        got = _carried(frames, protocol.decode_client_reply)
        assert len(got) == carried
        received += got
    assert received == items
    if len(items) > 1 and sum(len(body or b"") + 64 for _, body in items) < limit:
        assert len(packed) == 1, "what fits in one batch goes as one message"


def test_one_message_alone_goes_as_plain_frames_that_any_peer_reads():
    submit = protocol.Submit(protocol.PROTOCOL_VERSION, 3, "llm")
    assert protocol.pack(protocol.RequestBatch, [(submit, b"\xa1x")]) == [([protocol.encode(submit), b"\xa1x"], 1)]
    assert protocol.pack(protocol.RequestBatch, [(submit, None)]) == [([protocol.encode(submit)], 1)]


def test_a_batch_inside_a_batch_is_refused():
    inner = ["batch", 1, [[["ping", 1, 1], None]]]
    with pytest.raises(InvalidArgument, match="malformed client request"):
        protocol.decode_client_request(msgspec.msgpack.encode(["batch", 1, [[inner, None]]]))
