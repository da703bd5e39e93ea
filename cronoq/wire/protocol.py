"""The cronoq wire protocol: every message type, its encoding, and the one decoder per direction.

This module owns the wire format; docs/protocol.md describes it for authors
of clients in other languages. In short:

- A client or worker talks to the broker over a ZeroMQ DEALER socket. Each
  message it sends is 2 or 3 frames: ``[token, header]`` or
  ``[token, header, body]``. ``token`` is the raw token bytes (empty when the
  broker is open); ``header`` is a msgpack array whose first element is the
  message's tag (a string), the second the protocol version, then the
  message's fields in the order declared below (trailing defaults may be
  omitted); ``body`` is one msgpack document (a task's payload or a
  handler's result; nil when the frame is left out) that the broker checks
  for well-formedness (`check_body`), stores and forwards without decoding.
- The broker answers on its ROUTER sockets with ``[header]`` or
  ``[header, body]`` (ZeroMQ adds and strips the routing identity).
- Requests carry a request id ``rid`` chosen by the sender; the reply to a
  request carries the same ``rid``, so many requests may be in flight on one
  socket and replies may arrive out of order. An error carries the rid of
  what it refuses whenever that can be read (`peek_rid`), else 0.
- Several messages to the same peer may travel as one *batch*: a header
  ``["batch", 1, [[header, body-or-nil], ...]]`` with no body frame. Each
  side sends what one turn of its loop produced for a peer as one batch, so
  a busy broker pays libzmq and the event loop per batch, not per task.
  The broker reads a batch item by item (`read_client_requests`,
  `read_worker_messages`): an item it cannot read is refused on its own.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Union, get_args

import msgspec

from cronoq.errors import InvalidArgument

PROTOCOL_VERSION = 1

# Frame counts a peer may send (token + header, plus an optional body).
MIN_FRAMES = 2
MAX_FRAMES = 3


# --------------------------------------------------------------- bounds on what a peer sends
#
# Every string and collection a peer sends has a bound, checked where it enters (docs/security.md, "Limits").
# Names and ids are refused past theirs while the header is read (the refusal names the field); the text of a
# failure is cut instead, by the worker and again by the broker when the `done` arrives, because refusing a
# `done` would leave its task running on a worker that finished it. A header frame as a whole is bounded by
# libzmq (max_payload_bytes + 64 KiB), and the message of every error the broker sends by
# MAX_ERROR_MESSAGE_BYTES, so no reply echoes back more than that of what a peer sent.

MAX_NAME_CHARS = 200
"""Pools, tenants, keys, submission ids and setting names: the one bound on a name, which the task book's
submission rules and the broker's config check too."""
MAX_TASK_ID_CHARS = 256
"""Task ids a peer names (a broker's ids are 32 hex digits, after a cluster member's name and a colon)."""
MAX_READY_POOLS = 1024
"""Pools one `ready` may name."""
MAX_POOL_SETTINGS = 16
"""Settings one pool's entry in a `ready`'s `settings` may hold (six are known)."""

_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
_TaskId = Annotated[str, msgspec.Meta(max_length=MAX_TASK_ID_CHARS)]


class _Message(msgspec.Struct, array_like=True, frozen=True):
    """Common base: a tagged array whose second element is the protocol version.

    Every field is written, defaults included (msgspec does not leave trailing defaults out of arrays); a
    header read may leave out trailing fields that have a default, and may carry extra ones, which are ignored.
    """

    v: int


# --------------------------------------------------------------- client -> broker


class Submit(_Message, tag="submit"):
    """Queue a task. Body: the payload. Times are seconds from the broker's receipt.

    `submission` is the client's unique id for this submission: a client that
    re-sends a submit whose reply it never got (the broker restarted, the
    connection dropped) gets the task of the first one back, not a second task.
    `watch` asks for the task's `Outcome` too, under this submit's rid, as if a
    `Wait` had followed: one message per task fewer for clients that await results.
    `outcome_only` (with `watch`) leaves out the `accepted` reply: the outcome is
    the only answer, for a caller that wants the value and not the id
    (`Client.call`). A broker that does not know it sends `accepted` anyway.
    """

    rid: int
    pool: str = "default"
    tenant: Union[str, None] = None
    priority: str = "normal"
    deadline: Union[float, None] = None
    delay: Union[float, None] = None
    key: Union[str, None] = None
    max_retries: int = 0
    submission: Union[str, None] = None
    watch: bool = False
    cost: Union[float, None] = None
    """What the task charges its tenant's share in a pool with share_by = "cost" (None: 1). Sent only when
    given, so a broker that does not know it reads every other submit as before."""
    outcome_only: bool = False


class Wait(_Message, tag="wait"):
    """Ask for the task's outcome; answered with `Outcome` once it is terminal."""

    rid: int
    id: _TaskId


class Unwait(_Message, tag="unwait"):
    """Stop waiting for an earlier `Wait` (the caller's own timeout ran out). No reply."""

    rid: int
    id: _TaskId


class Status(_Message, tag="status"):
    """Ask for a task's `Info`."""

    rid: int
    id: _TaskId


class Explain(_Message, tag="explain"):
    """Ask why a task is where it is (`cronoq explain`); answered with `Ok` whose value is a map (the fields of
    `cronoq.answers.Explanation`, described in docs/protocol.md)."""

    rid: int
    id: _TaskId


class Cancel(_Message, tag="cancel"):
    """Cancel a task that has not been dispatched; answered with `Ok` (value: bool)."""

    rid: int
    id: _TaskId


class Pause(_Message, tag="pause"):
    """Stop dispatching a pool (it still accepts tasks). Admin only. Answered with `Ok`."""

    rid: int
    pool: _Name


class Resume(_Message, tag="resume"):
    """Dispatch a paused pool again. Admin only. Answered with `Ok`."""

    rid: int
    pool: _Name


class Stats(_Message, tag="stats"):
    """Ask for the broker's per-pool statistics. Admin only. Answered with `Ok` (value: map)."""

    rid: int


class Reload(_Message, tag="reload"):
    """Reread the broker's config file (as SIGHUP does). Admin only. Answered with `Ok` (value: what changed)
    or an `Error` FAILED_PRECONDITION naming what is wrong with the file; the running config then stays."""

    rid: int


class Ping(_Message, tag="ping"):
    """Liveness probe; answered with `Ok` (value: the protocol version)."""

    rid: int


class Hello(_Message, tag="hello"):
    """What the broker's rules are; answered with `Ok` whose value is a map (`hello_value`). Any role.

    Sent by a client on each new connection, so it checks payload sizes itself before sending.
    """

    rid: int


class ClusterRequest(_Message, tag="cluster"):
    """Ask for the cluster map; answered with `Ok` whose value is the map (`cronoq.wire.clustermap.cluster_map`), or nil
    from a broker that is no member of a cluster. Any role, on either endpoint (workers route by it too)."""

    rid: int


ClientRequest = Union[Submit, Wait, Unwait, Status, Cancel, Pause, Resume, Stats, Reload, Ping, Hello, Explain,
                      ClusterRequest]


class RequestBatch(_Message, tag="batch"):
    """Several client requests in one message, each with its body (or None); handled in order."""

    items: list[tuple[ClientRequest, Union[bytes, None]]]


# --------------------------------------------------------------- broker -> client


class Accepted(_Message, tag="accepted"):
    """The task was accepted (durably, when the broker has a data_dir)."""

    rid: int
    id: str
    duplicate: bool = False


class Outcome(_Message, tag="outcome"):
    """A task reached a terminal state. Body (state succeeded only): the handler's result."""

    rid: int
    id: str
    state: str
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


class Info(_Message, tag="info"):
    """What is known about one task; times are Unix seconds."""

    rid: int
    id: str
    pool: str
    tenant: Union[str, None]
    priority: str
    state: str
    attempts: int
    submitted_at: float
    started_at: Union[float, None] = None
    finished_at: Union[float, None] = None
    deadline: Union[float, None] = None
    error: Union[str, None] = None
    cost: Union[float, None] = None


class Ok(_Message, tag="ok"):
    """A plain successful reply carrying one value."""

    rid: int
    value: Any = None


class Error(_Message, tag="error"):
    """A refusal: `code` is one of cronoq's error codes; `rid` is 0 when unknown.

    `details` is nil, or a map a program can act on: a FAILED_PRECONDITION from a cluster member refusing
    a pool it does not own carries ``{"member": OWNER, "pool": POOL}`` (docs/protocol.md, "Clusters").
    """

    rid: int
    code: str
    message: str
    details: Union[dict[str, Any], None] = None


ClientReply = Union[Accepted, Outcome, Info, Ok, Error]


class ReplyBatch(_Message, tag="batch"):
    """Several replies to one client in one message, each with its body (or None), in the order sent."""

    items: list[tuple[ClientReply, Union[bytes, None]]]


# --------------------------------------------------------------- worker -> broker


class Ready(_Message, tag="ready"):
    """A worker announces itself: the pools it serves and how many tasks it can take now.

    `settings` holds, per pool, only the settings the worker's `Pool` set
    explicitly (tenant_weights, fair_share, max_in_flight, tenant_limits,
    default_weight, default_tenant_limit, share_by, tenant_rates,
    tenant_minimums); the broker refuses
    the worker with FAILED_PRECONDITION when one disagrees with its config.
    `concurrency` is the worker's total slots: the slots not free are busy with
    tasks whose `Done` will return them, and no other `Done` may add a slot.
    """

    rid: int
    pools: Annotated[list[_Name], msgspec.Meta(max_length=MAX_READY_POOLS)]
    slots: int
    settings: Annotated[dict[_Name, Annotated[dict[_Name, Any], msgspec.Meta(max_length=MAX_POOL_SETTINGS)]],
                        msgspec.Meta(max_length=MAX_READY_POOLS)] = {}
    concurrency: Union[int, None] = None


class Heartbeat(_Message, tag="heartbeat"):
    """I am alive. Sent both ways every heartbeat interval."""


class Done(_Message, tag="done"):
    """A worker finished a lease (task id + attempt) and has one more free slot.

    Body (ok only): the handler's result. The broker cuts the error fields to MAX_ERROR_*_BYTES (`bounded`).
    """

    id: _TaskId
    attempt: int
    ok: bool
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


class Leave(_Message, tag="leave"):
    """The worker is stopping: send it no more tasks. Its running tasks still report `Done`."""


class Bye(_Message, tag="bye"):
    """The worker is gone; it holds no task."""


WorkerMessage = Union[Ready, Heartbeat, Done, Leave, Bye, ClusterRequest]


class WorkerBatch(_Message, tag="batch"):
    """Several worker messages in one (typically the `done`s of one loop turn), each with its body or None."""

    items: list[tuple[WorkerMessage, Union[bytes, None]]]


# --------------------------------------------------------------- broker -> worker


class Welcome(_Message, tag="welcome"):
    """The worker was registered; it should heartbeat at this interval.

    `max_payload_bytes` is the largest result body the broker takes (nil from a broker that does not
    say): the worker reports a larger result as the task's failure instead of sending it.
    """

    rid: int
    heartbeat_interval: float
    liveness: int
    max_payload_bytes: Union[int, None] = None


class Assign(_Message, tag="task"):
    """Run this task. Body: the payload."""

    id: str
    attempt: int
    pool: str
    tenant: Union[str, None]
    priority: str


class Reregister(_Message, tag="reregister"):
    """The broker does not know this worker (it restarted or declared it lost): send Ready again."""


class Left(_Message, tag="left"):
    """Answer to `Leave`: no task will follow on this connection."""


WorkerCommand = Union[Welcome, Assign, Heartbeat, Reregister, Left, Ok, Error]


class CommandBatch(_Message, tag="batch"):
    """Several broker commands to one worker in one message (typically assignments), each with its body or None."""

    items: list[tuple[WorkerCommand, Union[bytes, None]]]


Batch = Union[RequestBatch, ReplyBatch, WorkerBatch, CommandBatch]
_BATCH_TYPES = (RequestBatch, ReplyBatch, WorkerBatch, CommandBatch)


# --------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
"""Encode one message struct (or a body value) to msgpack bytes."""

# A batch holds no batch: each decoder takes one direction's messages or one batch of them.
_client_request_decoder = msgspec.msgpack.Decoder(Union[ClientRequest, RequestBatch])
_client_reply_decoder = msgspec.msgpack.Decoder(Union[ClientReply, ReplyBatch])
_worker_message_decoder = msgspec.msgpack.Decoder(Union[WorkerMessage, WorkerBatch])
_worker_command_decoder = msgspec.msgpack.Decoder(Union[WorkerCommand, CommandBatch])

# A batch frame is kept well under the smallest frame a broker accepts (max_payload_bytes + 64 KiB): a
# message that would make it larger goes in a batch of its own or, alone, as plain frames.
BATCH_BYTES = 32 * 1024


def _unsupported(version: Any, what: str) -> InvalidArgument:
    return InvalidArgument(f"unsupported protocol version {version!r} in {what}; this broker speaks {PROTOCOL_VERSION}")


def _decoding(decoder: msgspec.msgpack.Decoder, header: bytes, what: str) -> Any:
    try:
        message = decoder.decode(header)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        peek = _peek(header)
        raise InvalidArgument(f"malformed {what}: {_named(str(exc), None if peek is None else peek.tag)}") from None
    except RecursionError:  # msgpack nested deeper than the stack: garbage, not a crash
        raise InvalidArgument(f"malformed {what}: nested too deeply") from None
    if message.v != PROTOCOL_VERSION:
        raise _unsupported(message.v, what)
    return message


def decode_client_request(header: bytes) -> ClientRequest | RequestBatch:
    """Decode a client's header frame; InvalidArgument names what is wrong."""
    return _decoding(_client_request_decoder, header, "client request")


def decode_client_reply(header: bytes) -> ClientReply | ReplyBatch:
    """Decode a broker reply received by a client."""
    return _decoding(_client_reply_decoder, header, "broker reply")


def decode_worker_message(header: bytes) -> WorkerMessage | WorkerBatch:
    """Decode a worker's header frame; InvalidArgument names what is wrong."""
    return _decoding(_worker_message_decoder, header, "worker message")


def decode_worker_command(header: bytes) -> WorkerCommand | CommandBatch:
    """Decode a broker command received by a worker."""
    return _decoding(_worker_command_decoder, header, "broker command")


def unbatch(message: Any, body: bytes | None) -> list[tuple[Any, bytes | None]]:
    """The (message, body) pairs one received message stands for: itself with its body frame, or a
    batch's items. InvalidArgument for a batch followed by a body frame (its bodies are inside it)."""
    if type(message) in _BATCH_TYPES:
        if body is not None:
            raise _body_after_batch()
        return message.items
    return [(message, body)]


def _body_after_batch() -> InvalidArgument:
    return InvalidArgument("a batch carries its bodies inside its header: no body frame may follow it")


# --------------------------------------------------------------- reading, item by item


class Refused(msgspec.Struct, frozen=True):
    """An item of a batch that could not be read: the error it earns, under its own rid where one could be read
    (0 otherwise). Readers hand it out in the item's place, so every item is answered in order."""

    rid: int
    error: InvalidArgument


class _Envelope(msgspec.Struct, array_like=True, tag="batch"):
    """A batch read without its items, which are then read one by one: one bad item costs only itself."""

    v: int
    items: list[msgspec.Raw]


_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)


class _Reader:
    """Reads the messages of one direction: a lone message, or a batch item by item."""

    def __init__(self, messages: Any, batch_type: type[Batch], what: str) -> None:
        self._decoder = msgspec.msgpack.Decoder(Union[messages, batch_type])
        self._item_decoder = msgspec.msgpack.Decoder(tuple[messages, Union[bytes, None]])
        self._batch_type = batch_type
        self._what = what
        self.tags = tuple(m.__struct_config__.tag for m in get_args(messages)) + ("batch",)

    def read(self, header: bytes, body: bytes | None) -> list[tuple[Any, bytes | None]]:
        """The (message, body) pairs a received message carries, in order; an item of a batch that cannot
        be read stands as a `Refused`. InvalidArgument when the message as a whole cannot be read (its rid,
        if any, is `peek_rid(header)`'s)."""
        try:
            message = self._decoder.decode(header)
        except msgspec.DecodeError as exc:
            # Rare, so it may cost more: a batch with bad items is read again, one item at a time.
            return self._read_items(header, body, exc)
        except RecursionError:  # msgpack nested deeper than the stack: garbage, not a crash
            raise InvalidArgument(f"malformed {self._what}: nested too deeply") from None
        if message.v != PROTOCOL_VERSION:
            raise _unsupported(message.v, self._what)
        if type(message) is not self._batch_type:
            return [(message, body)]
        if body is not None:
            raise _body_after_batch()
        items = message.items
        for item, _ in items:  # each item says its version too
            if item.v != PROTOCOL_VERSION:
                return [(m, b) if m.v == PROTOCOL_VERSION else (Refused(getattr(m, "rid", 0), _unsupported(
                    m.v, f"{self._what} (item {n} of a batch)")), None) for n, (m, b) in enumerate(items, 1)]
        return items

    def _read_items(self, header: bytes, body: bytes | None, whole: msgspec.DecodeError
                    ) -> list[tuple[Any, bytes | None]]:
        try:
            envelope = _envelope_decoder.decode(header)
        except (msgspec.DecodeError, RecursionError):
            raise InvalidArgument(f"malformed {self._what}: {self._explained(header, whole)}") from None
        if envelope.v != PROTOCOL_VERSION:
            raise _unsupported(envelope.v, self._what)
        if body is not None:
            raise _body_after_batch()
        out: list[tuple[Any, bytes | None]] = []
        for n, raw in enumerate(envelope.items, 1):
            what = f"{self._what} (item {n} of a batch)"
            try:
                message, item_body = self._item_decoder.decode(raw)
            except (msgspec.DecodeError, RecursionError) as exc:
                peek = _peek_item_tag(raw)
                out.append((Refused(_peek_item_rid(raw), InvalidArgument(
                    f"malformed {what}: {_named(str(exc), peek, item=True)}")), None))
                continue
            if message.v != PROTOCOL_VERSION:
                out.append((Refused(getattr(message, "rid", 0), _unsupported(message.v, what)), None))
                continue
            out.append((message, item_body))
        return out

    def _explained(self, header: bytes, exc: msgspec.DecodeError) -> str:
        """msgspec's words, with the tags this endpoint knows when the tag is what is wrong, and the field's name
        when one field is."""
        peek = _peek(header)
        if peek is not None and peek.tag not in self.tags:
            return f"unknown tag {clip(peek.tag, 64)!r}; a {self._what} is one of: {', '.join(self.tags)}"
        return _named(str(exc), None if peek is None else peek.tag)


_FIELDS = {message.__struct_config__.tag: message.__struct_fields__
           for message in get_args(Union[ClientRequest, ClientReply, WorkerMessage, WorkerCommand])}
_AT = re.compile(r"at `\$(\[0\])?\[(\d+)\]")


def _named(problem: str, tag: str | None, *, item: bool = False) -> str:
    """msgspec's account of a header it could not read, with the name of the field it points at (msgspec
    says only where: `$[n]` is the header's element n, the tag being element 0; in a batch item ([header, body]),
    `$[0][n]`)."""
    fields = _FIELDS.get(tag) if tag is not None else None
    found = _AT.search(problem)
    if fields is None or found is None or bool(found.group(1)) != item:
        return problem
    index = int(found.group(2)) - 1  # element 0 is the tag, and the fields start with the version
    if not 0 <= index < len(fields):
        return problem
    return f"{problem} (the field `{fields[index]}` of a `{tag}`)"


_client_requests = _Reader(ClientRequest, RequestBatch, "client request")
_worker_messages = _Reader(WorkerMessage, WorkerBatch, "worker message")
_client_replies = _Reader(ClientReply, ReplyBatch, "broker reply")
_worker_commands = _Reader(WorkerCommand, CommandBatch, "broker command")
read_client_requests = _client_requests.read
"""The requests one client message carries (see `_Reader.read`)."""
read_worker_messages = _worker_messages.read
"""The messages one worker message carries (see `_Reader.read`)."""
read_client_replies = _client_replies.read
"""The replies one broker message to a client carries (see `_Reader.read`)."""
read_worker_commands = _worker_commands.read
"""The commands one broker message to a worker carries (see `_Reader.read`)."""


def pack(batch_type: type[Batch], items: list[tuple[Any, bytes | None]],
         limit: int = BATCH_BYTES) -> list[tuple[list[bytes], int]]:
    """The messages that carry `items` ((message, body) pairs) to one peer, in order: each message's
    frames and how many of the items it carries.

    One item goes as plain frames, ``[header]`` or ``[header, body]``; more go as batches of at most
    `limit` bytes. Items are grouped by their bodies' sizes first, so that a big body (a big payload) goes
    alone, as plain frames, without being copied into a batch; a group whose headers make it too big after
    all (a long traceback) is split in halves until it fits.
    """
    if len(items) == 1:
        message, body = items[0]
        return [([_encoder.encode(message)] if body is None else [_encoder.encode(message), body], 1)]
    frame = _encoder.encode(batch_type(PROTOCOL_VERSION, items))
    if len(frame) <= limit:  # the usual case: many small replies, one batch
        return [([frame], len(items))]
    messages: list[tuple[list[bytes], int]] = []
    group: list[tuple[Any, bytes | None]] = []
    group_bytes = 0
    for item in items:
        size = _ITEM_OVERHEAD + (0 if item[1] is None else len(item[1]))
        if group and group_bytes + size > limit:
            messages += _split(batch_type, group, limit)
            group, group_bytes = [], 0
        group.append(item)
        group_bytes += size
    if group:
        messages += _split(batch_type, group, limit)
    return messages


# About what an item adds to a batch besides its body: the message's fields and the array around them.
_ITEM_OVERHEAD = 32


def _split(batch_type: type[Batch], items: list[tuple[Any, bytes | None]],
           limit: int) -> list[tuple[list[bytes], int]]:
    """`items` as one message, or in halves until each fits `limit` (or is one item, as plain frames)."""
    if len(items) == 1:
        message, body = items[0]
        return [([_encoder.encode(message)] if body is None else [_encoder.encode(message), body], 1)]
    frame = _encoder.encode(batch_type(PROTOCOL_VERSION, items))
    if len(frame) <= limit:
        return [([frame], len(items))]
    half = len(items) // 2
    return _split(batch_type, items[:half], limit) + _split(batch_type, items[half:], limit)


# --------------------------------------------------------------- sizes

# libzmq drops a connection that sends the broker a frame over max_payload_bytes + 64 KiB, and with it
# every task a worker holds. So sizes are checked where they are made: a client checks a payload, and a
# worker a result, against the max_payload_bytes the broker told it (`hello`, `welcome`); a worker cuts
# the text of a failure to these sizes (UTF-8 bytes), which keeps a `done` header far under 64 KiB
# whatever a handler raised.
MAX_ERROR_TYPE_BYTES = 256
MAX_ERROR_MESSAGE_BYTES = 8 * 1024
MAX_TRACEBACK_BYTES = 32 * 1024

def clip(text: str, limit: int) -> str:
    """`text` as it is if its UTF-8 encoding fits in `limit` bytes; else its start and its end around a
    marker saying how many bytes were cut, all within `limit` (for a limit of a few dozen bytes or more).
    Characters UTF-8 cannot carry (lone surrogates) become "?", so the result always encodes."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    room = max(0, limit - len(_cut_marker(len(data)).encode()))  # the marker only gets shorter below
    head = data[:room // 2].decode("utf-8", "ignore")  # "ignore" drops a character split by the cut
    tail = data[len(data) - (room - room // 2):].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return head + _cut_marker(cut) + tail


def _cut_marker(cut: int) -> str:
    return f"\n... [{cut} bytes cut] ...\n"


def _clipped(text: str, limit: int) -> str:
    # A string of at most limit / 4 characters fits whatever they are: only longer ones are measured.
    return text if len(text) <= limit >> 2 else clip(text, limit)


def bounded(done: Done) -> Done:
    """`done` with its error fields cut to MAX_ERROR_TYPE_BYTES, MAX_ERROR_MESSAGE_BYTES and MAX_TRACEBACK_BYTES,
    as a worker cuts them: a peer that does not is held to the same bounds where its `done` enters the broker,
    so a task's record, its outcome, `status` and the dashboard's recent failures hold no more than that."""
    if done.ok or (len(done.error_type) <= MAX_ERROR_TYPE_BYTES >> 2
                   and len(done.error_message) <= MAX_ERROR_MESSAGE_BYTES >> 2
                   and len(done.traceback) <= MAX_TRACEBACK_BYTES >> 2):
        return done
    return Done(done.v, done.id, done.attempt, done.ok, _clipped(done.error_type, MAX_ERROR_TYPE_BYTES),
                _clipped(done.error_message, MAX_ERROR_MESSAGE_BYTES), _clipped(done.traceback, MAX_TRACEBACK_BYTES))


def bounded_message(text: str) -> str:
    """An error's message as the broker sends it: at most MAX_ERROR_MESSAGE_BYTES, however much of a peer's
    input it quotes."""
    return _clipped(text, MAX_ERROR_MESSAGE_BYTES)


def payload_too_large(size: int, limit: int) -> str:
    """Why a payload of `size` bytes (as msgpack) is refused by a broker taking at most `limit`."""
    return (f"payload is {size} bytes as msgpack, over the broker's max_payload_bytes = {limit}; send less, "
            "or store the data elsewhere and send a reference to it")


def result_too_large(size: int, limit: int) -> str:
    """Why a result of `size` bytes (as msgpack) is not sent to a broker taking at most `limit`."""
    return (f"the result is {size} bytes as msgpack, over the broker's max_payload_bytes = {limit}; return less, "
            "or store the data elsewhere and return a reference to it")


def hello_value(max_payload_bytes: int, member: str | None = None) -> dict[str, Any]:
    """The value of the `ok` answering a `hello`: the broker's rules a client checks for itself; a cluster
    member adds its name (`member`), telling the client to ask for the cluster map and route by it."""
    value: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "max_payload_bytes": max_payload_bytes}
    if member is not None:
        value["member"] = member
    return value


def hello_member(value: Any) -> str | None:
    """The member name in a `hello` answer (a cluster member's), or None."""
    member = value.get("member") if isinstance(value, dict) else None
    return member if isinstance(member, str) and member else None


def advertised_limit(value: Any) -> int | None:
    """The max_payload_bytes in a `hello` answer, or None if it holds none that makes sense."""
    limit = value.get("max_payload_bytes") if isinstance(value, dict) else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


class _TagPeek(msgspec.Struct, array_like=True):
    """The tag of a header; the rest is skipped unread, so garbage costs little."""

    tag: str


class _RidPeek(msgspec.Struct, array_like=True):
    """The start every header with a rid shares: tag, version (of any type), rid; the rest is skipped unread."""

    tag: str
    v: msgspec.Raw
    rid: int


class _ItemRidPeek(msgspec.Struct, array_like=True):
    """The header of a batch item ([header, body])."""

    header: _RidPeek


_tag_decoder = msgspec.msgpack.Decoder(_TagPeek)
_rid_decoder = msgspec.msgpack.Decoder(_RidPeek)
_item_rid_decoder = msgspec.msgpack.Decoder(_ItemRidPeek)

RIDLESS_TAGS = frozenset({"batch"} | {
    message.__struct_config__.tag
    for message in get_args(Union[ClientRequest, ClientReply, WorkerMessage, WorkerCommand])
    if "rid" not in message.__struct_fields__
})
"""The tags of messages without a rid: their third element is never taken for one."""


def _peek(header: bytes) -> _TagPeek | None:
    try:
        return _tag_decoder.decode(header)
    except (msgspec.DecodeError, RecursionError):
        return None


def _rid_of(peek: _RidPeek) -> int:
    return 0 if peek.tag in RIDLESS_TAGS else peek.rid


def peek_rid(header: bytes) -> int:
    """The request id of a header that failed to read, so the error can be routed to its request: the third
    element of an array whose first is a tag with a rid (not one of RIDLESS_TAGS) and whose third is an
    integer, whatever the version and the other fields are; else 0."""
    try:
        return _rid_of(_rid_decoder.decode(header))
    except (msgspec.DecodeError, RecursionError):
        return 0


class _ItemTagPeek(msgspec.Struct, array_like=True):
    """The tag of a batch item's header ([header, body])."""

    header: _TagPeek


_item_tag_decoder = msgspec.msgpack.Decoder(_ItemTagPeek)


def _peek_item_tag(item: msgspec.Raw) -> str | None:
    try:
        return _item_tag_decoder.decode(item).header.tag
    except (msgspec.DecodeError, RecursionError):
        return None


def _peek_item_rid(item: msgspec.Raw) -> int:
    """`peek_rid` of the header of a batch item, [header, body]."""
    try:
        return _rid_of(_item_rid_decoder.decode(item).header)
    except (msgspec.DecodeError, RecursionError):
        return 0


# --------------------------------------------------------------- bodies

NIL_BODY = b"\xc0"
"""msgpack nil: the payload of a `submit` sent without a body frame, and the result of a `done` without one."""

_document_decoder = msgspec.msgpack.Decoder(msgspec.Raw)


def check_body(body: bytes, what: str) -> None:
    """InvalidArgument unless `body` is exactly one well-formed msgpack document.

    Its structure is walked (type bytes, lengths, nothing missing, nothing after it) without building any
    object: about 100 ns for a 100 B body and as much for a 1 MiB bin or str, 1.4 ms for 1 MiB made of
    87,000 small maps (decoding those takes over 20 ms). The UTF-8 inside strings is not checked.
    """
    try:
        _document_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"{what} is not one msgpack document ({exc}): encode it as msgpack") from None
    except RecursionError:
        raise InvalidArgument(f"{what} is not one msgpack document that can be read: it is nested too deeply") from None


MAX_COST = 1e9
"""The largest `cost` a task may declare: a billion units (tokens, pages; seconds in a pool that shares by run
time). Far above any real task's, it keeps a pool's tags (whole thousandths of a unit) well within 2**53."""


def check_cost(cost: object) -> None:
    """A task's `cost` is None (it counts 1) or a positive finite number no more than MAX_COST: InvalidArgument
    saying so otherwise. The client checks before sending, the task book again on receipt."""
    if cost is None:
        return
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
        raise InvalidArgument(f"cost must be a positive number (what the task charges its tenant's share in a pool "
                              f"with share_by = 'cost'), got {cost!r}")
    if cost > MAX_COST:
        raise InvalidArgument(f"cost must be at most {MAX_COST:g}, got {cost!r}")


def encode_body(value: Any) -> bytes:
    """Encode a payload or result; InvalidArgument if it is not msgpack-serializable."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"value is not msgpack-serializable: {exc}") from None


def decode_body(body: bytes) -> Any:
    """Decode a payload or result body."""
    return msgspec.msgpack.decode(body)
