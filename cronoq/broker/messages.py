"""Reading a routed message on either socket: its frames and the error reply (the `protocol.read_*` functions
open batches, item by item)."""

from __future__ import annotations

from cronoq import protocol
from cronoq.errors import CronoqError, InvalidArgument


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
    return protocol.Error(protocol.PROTOCOL_VERSION, rid, exc.code, exc.message)
