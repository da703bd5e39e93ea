"""The broker's wrong-endpoint hint: garbage never makes it raise; a real message of the other side always gets it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.broker.messages import wrong_endpoint_hint
from cronoq.errors import InvalidArgument
from cronoq.wire import protocol
from tests.wire.test_protocol_fuzz import headers

V = protocol.PROTOCOL_VERSION


@settings(max_examples=400, deadline=None)
@given(header=headers, this_socket=st.sampled_from(["client", "worker"]))
def test_any_header_gets_a_hint_or_none_and_never_an_exception(header: bytes, this_socket: str) -> None:
    hint = wrong_endpoint_hint([b"identity", b"", header], this_socket, "tcp://other:1")
    assert hint is None or (isinstance(hint, InvalidArgument) and "tcp://other:1" in hint.message)


@pytest.mark.parametrize("items, this_socket, says", [
    ([(protocol.Ready(V, 1, pools=["a"], slots=1), None)], "client", "workers connect to its worker endpoint"),
    ([(protocol.Heartbeat(V), None), (protocol.Done(V, "t", 1, True), b"\x01")], "client", "worker endpoint"),
    ([(protocol.Hello(V, 1), None)], "worker", "clients (and the cronoq command) connect to its client endpoint"),
    ([(protocol.Hello(V, 1), None), (protocol.Submit(V, 2), b"\x01")], "worker", "client endpoint"),
])
def test_the_other_sides_messages_alone_or_batched_are_told_where_to_go(items, this_socket, says) -> None:
    batch = protocol.RequestBatch if this_socket == "worker" else protocol.WorkerBatch
    (frames, _), = protocol.pack(batch, items)
    hint = wrong_endpoint_hint([b"identity", b"", *frames], this_socket, "tcp://other:1")
    assert hint is not None and says in hint.message and hint.message.endswith("(tcp://other:1)")


def test_a_sides_own_messages_get_no_hint() -> None:
    hello = protocol.encode(protocol.Hello(V, 1))
    ready = protocol.encode(protocol.Ready(V, 1, pools=["a"], slots=1))
    assert wrong_endpoint_hint([b"identity", b"", hello], "client", "x") is None
    assert wrong_endpoint_hint([b"identity", b"", ready], "worker", "x") is None
    assert wrong_endpoint_hint([b"identity", b""], "worker", "x") is None  # too few frames to tell
