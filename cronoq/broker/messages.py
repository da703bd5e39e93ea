"""Reading a routed message on either socket: its frames and the error reply (the `protocol.read_*` functions
open batches, item by item)."""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from cronoq.errors import CronoqError, InvalidArgument
from cronoq.wire import protocol


def check_frame_count(frames: list[bytes], rule: str) -> None:
    """`frames` starts with the peer's routing identity; what follows must be token, header, optional body."""
    count = len(frames) - 1
    if not protocol.MIN_FRAMES <= count <= protocol.MAX_FRAMES:
        got = f"more than {protocol.MAX_FRAMES}" if count > protocol.MAX_FRAMES else str(count)
        raise InvalidArgument(f"{rule}, got {got}")


def body_frame(frames: list[bytes]) -> bytes | None:
    """The optional body frame of a routed message (identity, token, header, body)."""
    return frames[3] if len(frames) > 3 else None


def error_reply(rid: int, exc: CronoqError) -> protocol.Error:
    """The `error` answering `rid`; its message is cut to protocol.MAX_ERROR_MESSAGE_BYTES, so a refusal that
    quotes what a peer sent (a name, a settings table) is never larger than that."""
    return protocol.Error(protocol.PROTOCOL_VERSION, rid, exc.code, protocol.bounded_message(exc.message),
                          exc.details)


# The first tag of each socket's messages: enough to tell a peer that it came to the wrong endpoint.
# (`cluster` is taken on both, so it says nothing.)
_BOTH_TAGS = frozenset({protocol.ClusterRequest.__struct_config__.tag})
_CLIENT_TAGS = frozenset(kind.__struct_config__.tag for kind in get_args(protocol.ClientRequest)) - _BOTH_TAGS
_WORKER_TAGS = frozenset(kind.__struct_config__.tag for kind in get_args(protocol.WorkerMessage)) - _BOTH_TAGS


class _TagPeek(msgspec.Struct, array_like=True):
    tag: str


class _BatchPeek(msgspec.Struct, array_like=True):
    tag: str
    v: Any
    items: list[msgspec.Raw]  # left unread: only the first one's tag is looked at


_tag_decoder = msgspec.msgpack.Decoder(_TagPeek)
_batch_decoder = msgspec.msgpack.Decoder(_BatchPeek)
_item_decoder = msgspec.msgpack.Decoder(tuple[msgspec.Raw, msgspec.Raw])


def _first_tag(header: bytes) -> str | None:
    """The tag of a header, or of the first message of a batch; None if it has none that can be read."""
    try:
        tag = _tag_decoder.decode(header).tag
        if tag == "batch":
            items = _batch_decoder.decode(header).items
            tag = _tag_decoder.decode(_item_decoder.decode(items[0])[0]).tag if items else None
    except (msgspec.DecodeError, RecursionError):
        return None
    return tag


def wrong_endpoint_hint(frames: list[bytes], this_socket: str, other_endpoint: str) -> InvalidArgument | None:
    """The refusal for a message that belongs on the broker's other endpoint, naming it; None if the message
    (frames as routed: identity, token, header, ...) is not the other endpoint's.

    `this_socket` is "client" or "worker": which endpoint received it. Called only for a message that was
    refused anyway, so a peer that came to the wrong place learns where to go rather than why its message
    does not parse here.
    """
    tag = _first_tag(frames[2]) if len(frames) > 2 else None
    if this_socket == "client" and tag in _WORKER_TAGS:
        return InvalidArgument(f"this is the broker's client endpoint; workers connect to its worker endpoint "
                               f"({other_endpoint})")
    if this_socket == "worker" and tag in _CLIENT_TAGS:
        return InvalidArgument(f"this is the broker's worker endpoint; clients (and the cronoq command) connect to "
                               f"its client endpoint ({other_endpoint})")
    return None


def refuse_if_misdirected(frames: list[bytes], messages: list[tuple[Any, bytes | None]], this_socket: str,
                          other_endpoint: str) -> None:
    """Raise the wrong-endpoint refusal for a batch that belongs on the other endpoint: none of its items
    could be read here, and the first is the other endpoint's (a client's `hello` and `stats` sent to the worker
    endpoint, say). One refusal naming the right endpoint, under rid 0, says more than an error per item;
    a batch with anything this endpoint can read is answered item by item. Looked at only when every item was
    refused, so a good batch costs nothing more.
    """
    if all(type(message) is protocol.Refused for message, _ in messages):
        hint = wrong_endpoint_hint(frames, this_socket, other_endpoint)
        if hint is not None:
            raise hint
