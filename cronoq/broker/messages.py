"""Reading a routed message on either socket: its frames, one message or a batch's, and the error reply."""

from __future__ import annotations

from typing import Any

from cronoq import protocol
from cronoq.errors import CronoqError, InvalidArgument


def check_frame_count(frames: list[bytes], rule: str) -> None:
    """`frames` starts with the peer's routing identity; what follows must be token, header, optional body."""
    count = len(frames) - 1
    if not protocol.MIN_FRAMES <= count <= protocol.MAX_FRAMES:
        got = f"more than {protocol.MAX_FRAMES}" if count > protocol.MAX_FRAMES else str(count)
        raise InvalidArgument(f"{rule}, got {got}")


def unpack(frames: list[bytes], message: Any, batch_type: type[protocol.Batch]) -> list[tuple[Any, bytes | None]]:
    """The (message, body) pairs that a routed message's decoded header stands for: itself, or a batch's."""
    if type(message) is batch_type:
        if len(frames) > 3:
            raise InvalidArgument("a batch carries its bodies inside its header: no body frame may follow it")
        return message.items  # type: ignore[attr-defined]
    return [(message, frames[3] if len(frames) > 3 else None)]


def error_reply(rid: int, exc: CronoqError) -> protocol.Error:
    return protocol.Error(protocol.PROTOCOL_VERSION, rid, exc.code, exc.message)
