"""Hostile input: garbage frame sequences on both sockets, replayed and out-of-order worker messages.

The fuzz tests drive a real Broker object's message handlers (with a real
journal) without sockets, so Hypothesis can send thousands of sequences; the
last test sends garbage over tcp to a real broker process and then uses it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cronoq
from cronoq.broker.config import parse_config
from cronoq.broker.server import Broker
from cronoq.wire import protocol
from tests.integration.test_faults import WAIT
from tests.support import BEATS, peer, rss_kib, until
from tests.wire.test_protocol_fuzz import TAGS, values

V = protocol.PROTOCOL_VERSION
NOW = 1_000_000.0


def in_process_broker(data_dir: Path) -> Broker:
    config = parse_config({"broker": {"data_dir": str(data_dir)}, "pools": [{"name": "default"}, {"name": "held"}]},
                          source="test", base_dir=data_dir.parent, environ={})
    broker = Broker(config, clock=lambda: NOW)
    broker.open()
    return broker


def client_says(broker: Broker, identity: bytes, message: Any, body: bytes | None = None) -> list[Any]:
    """Hand the broker one client message; returns the replies it would send."""
    frames = [identity, b"", protocol.encode(message)] + ([body] if body is not None else [])
    broker._requests.on_message(peer(identity), frames, NOW)
    return _replies(broker)


def worker_says(broker: Broker, identity: bytes, message: Any, body: bytes | None = None) -> list[Any]:
    frames = [identity, b"", protocol.encode(message)] + ([body] if body is not None else [])
    broker._on_worker_message(peer(identity), frames, NOW)
    return _replies(broker)


def _replies(broker: Broker) -> list[Any]:
    broker._dispatch(NOW)
    assert broker._commit()
    out = [[protocol.encode(message)] + ([body] if body is not None else [])
           for box in (broker._to_clients, broker._to_workers) for _, message, body in box.items()]
    broker._to_clients.clear()
    broker._to_workers.clear()
    return out


class Scene:
    """A broker holding a task queued in a paused pool and a task running on a real worker."""

    def __init__(self, data_dir: Path) -> None:
        self.broker = broker = in_process_broker(data_dir)
        client_says(broker, b"client", protocol.Pause(V, 1, "held"))
        self.queued = self._submit(2, "held", "q")
        self.running = self._submit(3, "default", "r")
        self.assigned = worker_says(broker, b"worker", protocol.Ready(V, 1, ["default"], 1, concurrency=1))

    def _submit(self, rid: int, pool: str, payload: str) -> str:
        [[header]] = client_says(self.broker, b"client", protocol.Submit(V, rid, pool, "acme"),
                                 msgspec.msgpack.encode(payload))
        return protocol.decode_client_reply(header).id

    def picture(self) -> list[tuple]:
        book = self.broker._book
        return [(book.info(i).state, book.info(i).attempts, book.get(i).payload, book.get(i).result)
                for i in (self.queued, self.running)]


tokens = st.sampled_from([b"", b"", b"not-a-token"])
client_headers = st.one_of(
    st.binary(max_size=48),
    values.map(msgspec.msgpack.encode),
    st.builds(lambda tag, version, fields: msgspec.msgpack.encode([tag, version, *fields]),
              st.sampled_from(TAGS), st.sampled_from([V, V, V, 0, 2]), st.lists(values, max_size=10)),
)
# Bodies as a batch item carries them: nil, msgpack, garbage bytes, or not bin at all.
item_bodies = st.one_of(st.none(), values.map(msgspec.msgpack.encode), st.binary(max_size=8), st.text(max_size=3))
# A batch item with a rid where requests have one (unless the tag is one without): [[tag, version, rid, ...], body].
rid_items = st.tuples(st.sampled_from(TAGS), st.sampled_from([V, V, V, 2, "1"]), st.lists(values, max_size=9), item_bodies)
batches = st.builds(lambda items: msgspec.msgpack.encode(
    ["batch", V, [[[tag, version, n, *fields], body] for n, (tag, version, fields, body) in enumerate(items, 1)]]),
    st.lists(rid_items, max_size=6))
frame_sequences = st.one_of(
    st.lists(st.binary(max_size=24), max_size=6),  # anything at all, any number of frames
    st.builds(lambda token, header, body: [token, header, *body],
              tokens, st.one_of(client_headers, batches), st.lists(st.binary(max_size=24), max_size=2)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["client", "worker"]), st.sampled_from([b"fuzz-1", b"fuzz-2"]),
                          frame_sequences), min_size=1, max_size=8))
def test_garbage_on_either_socket_touches_no_task_and_stops_nothing(scene_and_log, messages):
    scene, caplog = scene_and_log
    before = scene.picture()
    for side, identity, frames in messages:
        handle = scene.broker._requests.on_message if side == "client" else scene.broker._on_worker_message
        handle(peer(identity), [identity, *frames], NOW)
        for reply in _replies(scene.broker):
            if side == "client":  # every reply routed back to a client is a well-formed message
                protocol.decode_client_reply(reply[0])
            else:
                protocol.decode_worker_command(reply[0])
    assert scene.picture() == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a message made the broker fail"


_batch_rids = itertools.count(1_000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(rid_items, values), min_size=1, max_size=10))
def test_every_item_of_a_clients_batch_is_answered_under_its_own_rid(scene_and_log, items):
    """A batch with a good token: each item gets its reply, or its error, under its own rid where its header
    shows one (items that cannot show one are refused under rid 0), however ill-typed the others are."""
    scene, caplog = scene_and_log
    client_says(scene.broker, b"batcher", protocol.Ping(V, 1))  # a peer that showed a good token: never rationed
    before = scene.picture()
    wire, owed, assigned = [], collections.Counter(), set()
    for item in items:
        if not isinstance(item, tuple):
            wire.append(item)  # anything at all: read as an item, or refused under whatever rid it shows
            continue
        tag, version, fields, body = item
        rid = next(_batch_rids)
        assigned.add(rid)
        wire.append([[tag, version, rid, *fields], body])
        alone = protocol.read_client_requests(msgspec.msgpack.encode(["batch", V, [wire[-1]]]), None)[0][0]
        if tag not in protocol.RIDLESS_TAGS and not isinstance(alone, protocol.Unwait):  # unwait has no reply
            owed[rid] += 1
    scene.broker._requests.on_message(peer(b"batcher"), [b"batcher", b"", msgspec.msgpack.encode(["batch", V, wire])], NOW)
    answered = collections.Counter()
    replies = [reply for frames in _replies(scene.broker)
               for reply, _ in protocol.unbatch(protocol.decode_client_reply(frames[0]), None)]
    if misdirected(wire):  # a worker's batch sent here: one refusal naming the worker endpoint, under rid 0
        assert [(r.rid, r.code) for r in replies] == [(0, "INVALID_ARGUMENT")]
        assert "worker endpoint" in replies[0].message
        return
    for reply in replies:
        answered[reply.rid] += 1
    assert {rid for rid in owed} <= set(answered), "an item went unanswered"
    assert set(answered) & assigned == set(owed), "a reply under the rid of an item that has none"
    assert scene.picture() == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a message made the broker fail"


def misdirected(wire: list) -> bool:
    """Whether a client batch is a worker's: its first item has a worker's tag, and none reads as a request."""
    worker_tags = {kind.__struct_config__.tag for kind in typing.get_args(protocol.WorkerMessage)}
    first = wire[0][0] if wire and isinstance(wire[0], list) and wire[0] and isinstance(wire[0][0], list) else None
    if not first or not isinstance(first[0], str) or first[0] not in worker_tags:
        return False
    refused = protocol.read_client_requests(msgspec.msgpack.encode(["batch", V, wire]), None)
    return all(isinstance(request, protocol.Refused) for request, _ in refused)


@pytest.fixture
def scene_and_log(tmp_path, caplog):
    scene = Scene(tmp_path / "data")
    yield scene, caplog
    # Whatever the garbage did, the journal it left behind reads back, with both tasks as they were.
    before = scene.picture()
    scene.broker.close()
    again = in_process_broker(tmp_path / "data")
    book = again._book
    assert [book.info(i).state for i in (scene.queued, scene.running)] == ["queued", "queued"]  # running: requeued
    assert [book.get(i).payload for i in (scene.queued, scene.running)] == [b[2] for b in before]
    again.close()


def test_replayed_and_out_of_order_worker_messages_are_harmless(tmp_path):
    scene = Scene(tmp_path / "data")
    broker, core = scene.broker, scene.broker._core
    [welcome], [header, payload] = scene.assigned
    assert isinstance(protocol.decode_worker_command(welcome), protocol.Welcome)
    task = protocol.decode_worker_command(header)
    assert (task.id, task.attempt) == (scene.running, 1) and core.free_slots(peer(b"worker")) == 0

    # Outcomes for a task nobody runs, and for the wrong attempt, change nothing and free no slot.
    worker_says(broker, b"worker", protocol.Done(V, "no-such-task", 1, True), b"\x01")
    worker_says(broker, b"worker", protocol.Done(V, scene.running, 2, True), b"\x02")
    assert scene.picture()[1] == ("running", 1, payload, None) and core.free_slots(peer(b"worker")) == 0
    # Another worker cannot complete this worker's lease.
    worker_says(broker, b"intruder", protocol.Ready(V, 1, ["default"], 1, concurrency=1))
    worker_says(broker, b"intruder", protocol.Done(V, scene.running, 1, True), b"\x03")
    assert scene.picture()[1][0] == "running"
    # The real outcome counts once; its replay neither changes the result nor adds a slot.
    worker_says(broker, b"worker", protocol.Done(V, scene.running, 1, True), b"\x04")
    worker_says(broker, b"worker", protocol.Done(V, scene.running, 1, False, "Late", "replayed"))
    worker_says(broker, b"worker", protocol.Done(V, scene.running, 1, True), b"\x05")
    assert scene.picture()[1] == ("succeeded", 1, b"", b"\x04")
    assert core.free_slots(peer(b"worker")) == 1
    # A worker that registers again while running a task it got before is owed exactly that slot back.
    worker_says(broker, b"late", protocol.Ready(V, 1, ["default"], 1, concurrency=2))
    worker_says(broker, b"late", protocol.Done(V, "from-before", 1, True), b"\x06")
    worker_says(broker, b"late", protocol.Done(V, "from-before", 1, True), b"\x06")
    assert core.free_slots(peer(b"late")) == 2
    broker.close()


async def test_garbage_over_tcp_on_both_sockets_leaves_the_broker_serving(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n', name="garbage.toml")
    ctx = zmq.Context.instance()
    async with cronoq.connect(broker.clients) as client:
        await client.pause("default")
        waiting = [await client.submit(n, tenant="acme") for n in range(10)]
        start_rss = rss_kib(broker.proc.pid)
        socks = []
        for endpoint in (broker.clients, broker.workers):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(endpoint)
            socks.append(sock)
        garbage = [
            [b"\x00\xff"], [b"", b"\xc1"], [b"", b"\x93\xa6submit\x01\xcd\x04\xd2", b"", b"", b""],
            [b"", msgspec.msgpack.encode(["submit", 1, 77, 5, 5, 5])], [b"", msgspec.msgpack.encode(["done", 1, "x"])],
            [b"", msgspec.msgpack.encode(["ready", 1, 1, ["default"], -4])], [b"", b"\x91" * 5000],
            [b"", msgspec.msgpack.encode(["submit", 9, 1])], [b"", msgspec.msgpack.encode({"not": "an array"})],
        ]
        for n in range(4000):  # 36,000 messages over both sockets
            for sock in socks:
                for frames in garbage:
                    sock.send_multipart(frames)
        # A frame far over max_payload_bytes: libzmq drops that connection instead of buffering it.
        socks[0].send_multipart([b"", b"\x00" * (2 << 20)])

        replies = 0
        while socks[0].poll(2000) and replies < 100:
            reply = protocol.decode_client_reply(socks[0].recv_multipart()[0])
            # Errors of one loop pass come back together, as a batch.
            for error, _ in (reply.items if isinstance(reply, protocol.ReplyBatch) else [(reply, None)]):
                assert isinstance(error, protocol.Error) and error.code == "INVALID_ARGUMENT", error
                replies += 1
        assert replies, "a client sending garbage gets INVALID_ARGUMENT errors back"
        for sock in socks:
            sock.close()

        # Still serving, nothing waiting was touched, and the flood left no lasting weight.
        async def drained() -> bool:
            return (await client.stats())["pools"]["default"]["queued"] == 10
        await until(drained, "the broker answers again")
        assert [(await client.status(h.id)).state for h in waiting] == ["queued"] * 10
        await client.resume("default")
        worker = cronoq.Worker(broker.workers, cronoq.Pool("default", _echo), **BEATS)
        run = asyncio.get_running_loop().create_task(worker.run())
        try:
            assert [await h.result(timeout=WAIT) for h in waiting] == list(range(10))
        finally:
            await worker.stop()
            await run
        assert rss_kib(broker.proc.pid) - start_rss < 32 * 1024, "a flood of garbage must not leave the broker heavier"


async def _echo(payload: Any) -> Any:
    return payload
