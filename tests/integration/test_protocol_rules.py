"""The protocol's validation and rid rules (docs/protocol.md, "Validation and rid rules"), on a real Broker.

Driven through a real Broker object's handlers (a real journal, no sockets), like the hostile-input tests; the
shared vectors (tests/wire/test_protocol_vectors.py) replay the same rules over tcp against the broker process.
"""

from __future__ import annotations

import msgspec

from cronoq.broker.config import parse_config
from cronoq.broker.server import Broker
from cronoq.wire import protocol
from tests.integration.test_hostile import NOW, V, _replies, client_says, in_process_broker, worker_says
from tests.support import peer

encode = msgspec.msgpack.encode


def _said(broker: Broker, identity: bytes, header: bytes, *body: bytes, token: bytes = b"") -> list:
    """Hand the client socket hand-made frames; the replies to clients, as (message, body) pairs."""
    broker._requests.on_message(peer(identity), [identity, token, header, *body], NOW)
    return _sent(broker)[0]


def _worker_said(broker: Broker, identity: bytes, header: bytes, *body: bytes, token: bytes = b"") -> list:
    """Hand the worker socket hand-made frames; the commands to workers, as (message, body) pairs."""
    broker._on_worker_message(peer(identity), [identity, token, header, *body], NOW)
    return _sent(broker)[1]


def _sent(broker: Broker) -> tuple[list, list]:
    """What the broker's pass sends to clients and to workers, each as (message, body) pairs, after a round
    trip through the wire format."""
    broker._dispatch(NOW)
    assert broker._commit()
    sent = []
    for box, decode in ((broker._to_clients, protocol.decode_client_reply),
                        (broker._to_workers, protocol.decode_worker_command)):
        sent.append([(decode(protocol.encode(message)), body) for _, message, body in box.items()])
        box.clear()
    return sent[0], sent[1]


def _summary(replies: list) -> list[tuple]:
    return [(type(r).__name__, r.rid, getattr(r, "code", None)) for r, _ in replies]


# ------------------------------------------------------------------ bodies


def test_a_body_that_is_not_msgpack_is_refused_at_submit_and_queues_nothing(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    for rid, body in enumerate([b"\xc1", b"\x92\x01", b"\x01\x02", b"\xd9\x05ab", b"{\"json\": 1}"], start=1):
        [(error, _)] = _said(broker, b"client", encode(["submit", 1, rid]), body)
        assert (type(error), error.rid, error.code) == (protocol.Error, rid, "INVALID_ARGUMENT"), error
        assert "not one msgpack document" in error.message
    # In a batch too: the bad item is refused under its rid, the good one is taken.
    batch = protocol.RequestBatch(V, [(protocol.Submit(V, 10), b"\xc1"), (protocol.Submit(V, 11), b"\x01")])
    assert _summary(_said(broker, b"client", protocol.encode(batch))) == [
        ("Error", 10, "INVALID_ARGUMENT"), ("Accepted", 11, None)]
    assert broker._core.stats()["default"]["queued"] == 1
    broker.close()


def test_a_submit_without_a_body_frame_queues_a_nil_payload(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    [(accepted, _)] = _said(broker, b"client", encode(["submit", 1, 4]))
    assert isinstance(accepted, protocol.Accepted) and accepted.rid == 4
    assert broker._book.get(accepted.id).payload == b"\xc0"
    # The worker gets the nil payload as the task's body.
    [(_, _), (task, body)] = _worker_said(broker, b"worker", protocol.encode(protocol.Ready(V, 1, ["default"], 1)))
    assert (task.id, body) == (accepted.id, b"\xc0")
    broker.close()


def test_a_result_that_is_not_msgpack_fails_its_task_with_a_clear_error(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    [[header]] = client_says(broker, b"client", protocol.Submit(V, 1, watch=True), b"\x01")
    task_id = protocol.decode_client_reply(header).id
    worker_says(broker, b"worker", protocol.Ready(V, 1, ["default"], 1))
    replies = worker_says(broker, b"worker", protocol.Done(V, task_id, 1, True), b"\x92\x01")
    [[outcome_header]] = replies  # no body: nothing of the garbage reaches the client
    outcome = protocol.decode_client_reply(outcome_header)
    assert (outcome.rid, outcome.state, outcome.error_type) == (1, "failed", "InvalidArgument")
    assert "not one msgpack document" in outcome.error_message
    assert broker._book.get(task_id).result is None
    broker.close()


# ------------------------------------------------------------------ batches: each item answered on its own


def test_one_ill_typed_item_costs_only_itself_and_every_item_is_answered_under_its_rid(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    body = encode("payload")
    batch = encode(["batch", 1, [
        [["submit", 1, 1, "default", "acme"], body],
        [["submit", 1, 2, 77], body],                      # pool is an int
        [["ping", 1, 3], None],
        [["submit", 1, 4, "default", None, "normal", None, None, None, 0, None, 1], body],  # watch is an int
        [["ping", 2, 5], None],                            # a version this broker does not speak
        [["status", 1, 6], None],                          # id missing
        [["ping", 1, 7], "not bin"],                       # a body must be msgpack bin or nil
        [["batch", 1, []], None],                          # no batch inside a batch
        ["ping", 1, 8],                                    # not a [header, body] pair: its rid cannot be read
        17,
        [["hello", 1, 9], None],
    ]])
    replies = _said(broker, b"client", batch)
    assert _summary(replies) == [
        ("Accepted", 1, None), ("Error", 2, "INVALID_ARGUMENT"), ("Ok", 3, None), ("Error", 4, "INVALID_ARGUMENT"),
        ("Error", 5, "INVALID_ARGUMENT"), ("Error", 6, "INVALID_ARGUMENT"), ("Error", 7, "INVALID_ARGUMENT"),
        ("Error", 0, "INVALID_ARGUMENT"), ("Error", 0, "INVALID_ARGUMENT"), ("Error", 0, "INVALID_ARGUMENT"),
        ("Ok", 9, None),
    ]
    messages = [reply.message for reply, _ in replies if isinstance(reply, protocol.Error)]
    assert "item 2" in messages[0] and "unsupported protocol version 2" in messages[2]
    assert broker._core.stats()["default"]["queued"] == 1
    broker.close()


def test_a_batch_with_a_bad_token_still_earns_exactly_one_error(tmp_path):
    """The anti-amplification rule stands: per-item answers are for batches sent with a good token."""
    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")},
                           "auth": {"tokens": [{"token_env": "T", "role": "client"}]}},
                          source="test", base_dir=tmp_path, environ={"T": "s3cret"})
    broker = Broker(config, clock=lambda: NOW)
    broker.open()
    batch = encode(["batch", 1, [[["ping", 1, 1], None], [["ping", 1, "x"], None], [["ping", 1, 3], None]]])
    assert _summary(_said(broker, b"client", batch, token=b"wrong")) == [("Error", 0, "UNAUTHENTICATED")]
    assert _summary(_said(broker, b"client", batch, token=b"s3cret")) == [
        ("Ok", 1, None), ("Error", 0, "INVALID_ARGUMENT"), ("Ok", 3, None)]
    broker.close()


def test_one_bad_item_in_a_workers_batch_does_not_lose_its_other_dones(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    ids = []
    for rid in (1, 2):
        [[header]] = client_says(broker, b"client", protocol.Submit(V, rid, watch=True), encode(rid))
        ids.append(protocol.decode_client_reply(header).id)
    worker_says(broker, b"worker", protocol.Ready(V, 1, ["default"], 2, concurrency=2))
    batch = encode(["batch", 1, [
        [["done", 1, ids[0], 1, True], encode("one")],
        [["done", 1, ids[1], "first", True], encode("two")],  # attempt is a string
        [["done", 1, ids[1], 1, True], encode("two")],
    ]])
    broker._on_worker_message(peer(b"worker"), [b"worker", b"", batch], NOW)
    to_clients, to_workers = _sent(broker)
    assert _summary(to_workers) == [("Error", 0, "INVALID_ARGUMENT")]
    assert _summary(to_clients) == [("Outcome", 1, None), ("Outcome", 2, None)]
    assert [broker._book.info(i).state for i in ids] == ["succeeded", "succeeded"]
    broker.close()


# ------------------------------------------------------------------ rid echo


def test_errors_carry_the_rid_whenever_it_can_be_read(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    # Each peer first shows it is one: a connection that sent nothing readable earns one error a second.
    _said(broker, b"client", encode(["ping", 1, 40]))
    _worker_said(broker, b"w1", encode(["heartbeat", 1]))
    # The version as a string, on both endpoints.
    assert _summary(_said(broker, b"client", encode(["ping", "1", 41]))) == [("Error", 41, "INVALID_ARGUMENT")]
    assert _summary(_worker_said(broker, b"w1", encode(["ready", "1", 42, ["default"], 1]))) == [
        ("Error", 42, "INVALID_ARGUMENT")]
    # A tag the worker endpoint does not know.
    [(error, _)] = _worker_said(broker, b"w1", encode(["frobnicate", 1, 43]))
    assert (error.rid, error.code) == (43, "INVALID_ARGUMENT") and "unknown tag 'frobnicate'" in error.message
    # A client's request sent to the wrong endpoint: rid 0, so the client fails all it sent there.
    [(error, _)] = _worker_said(broker, b"w1", encode(["submit", 1, 46]))
    assert (error.rid, error.code) == (0, "INVALID_ARGUMENT") and "worker endpoint" in error.message
    # Messages without a rid never lend their third field as one.
    assert _summary(_worker_said(broker, b"w1", encode(["done", 1, 44]))) == [("Error", 0, "INVALID_ARGUMENT")]
    # Too many frames: the header is still read for its rid.
    assert _summary(_said(broker, b"client", encode(["ping", 1, 45]), b"\xc0", b"\xc0")) == [
        ("Error", 45, "INVALID_ARGUMENT")]
    broker.close()


def test_a_refused_ready_carries_its_rid_whatever_refused_it(tmp_path):
    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")},
                           "auth": {"tokens": [{"token_env": "C", "role": "client"},
                                               {"token_env": "W", "role": "worker"}]}},
                          source="test", base_dir=tmp_path, environ={"C": "client-secret", "W": "worker-secret"})
    broker = Broker(config, clock=lambda: NOW)
    broker.open()
    ready = encode(["ready", 1, 51, ["default"], 1])
    assert _summary(_worker_said(broker, b"w1", ready, token=b"client-secret")) == [("Error", 51, "PERMISSION_DENIED")]
    assert _summary(_worker_said(broker, b"w2", ready, token=b"")) == [("Error", 51, "UNAUTHENTICATED")]
    assert _summary(_worker_said(broker, b"w3", encode(["ready", 1, 52, ["nope"], 1]), token=b"worker-secret")) == [
        ("Error", 52, "NOT_FOUND")]
    broker.close()
