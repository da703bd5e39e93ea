"""The shared protocol vectors (docs/protocol-vectors/): written here, read by any implementation.

`python -m tests.wire.protocol_vectors` (re)writes docs/protocol-vectors/*.json from the cases below, and
tests/wire/test_protocol_vectors.py checks the files on disk are exactly what this module writes, replays every
vector against a real broker process and round-trips every message through `cronoq.wire.protocol`.

The cases are written by hand from docs/protocol.md, never derived from `cronoq.wire.protocol`: headers are plain
msgpack arrays built from the field tables in `FIELDS` (a copy of the docs' tables), and the expected replies
are spelt out. The file format is described in docs/protocol-vectors/README.md; the helpers below are only a
shorthand for writing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgspec

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "protocol-vectors"

# The fields after tag and version, in wire order, as docs/protocol.md lists them: a name alone is required,
# (name, default) may be left out when it and every field after it hold their default.
REQUIRED = object()
FIELDS: dict[str, list[tuple[str, Any]]] = {
    "submit": [("rid", REQUIRED), ("pool", "default"), ("tenant", None), ("priority", "normal"), ("deadline", None),
               ("delay", None), ("key", None), ("max_retries", 0), ("submission", None), ("watch", False),
               ("cost", None), ("outcome_only", False)],
    "wait": [("rid", REQUIRED), ("id", REQUIRED)],
    "unwait": [("rid", REQUIRED), ("id", REQUIRED)],
    "status": [("rid", REQUIRED), ("id", REQUIRED)],
    "explain": [("rid", REQUIRED), ("id", REQUIRED)],
    "cancel": [("rid", REQUIRED), ("id", REQUIRED)],
    "pause": [("rid", REQUIRED), ("pool", REQUIRED)],
    "resume": [("rid", REQUIRED), ("pool", REQUIRED)],
    "stats": [("rid", REQUIRED)],
    "reload": [("rid", REQUIRED)],
    "ping": [("rid", REQUIRED)],
    "hello": [("rid", REQUIRED)],
    "cluster": [("rid", REQUIRED)],
    "ready": [("rid", REQUIRED), ("pools", REQUIRED), ("slots", REQUIRED), ("settings", {}), ("concurrency", None)],
    "heartbeat": [],
    "done": [("id", REQUIRED), ("attempt", REQUIRED), ("ok", REQUIRED), ("error_type", ""), ("error_message", ""),
             ("traceback", "")],
    "leave": [],
    "bye": [],
}

TOKENS = {"client": b"client-secret", "worker": b"worker-secret", "admin": b"admin-secret"}

# ----------------------------------------------------------------------------- shorthand for writing cases


@dataclass(frozen=True)
class Cap:
    """A string captured from an earlier reply, put in a header sent later: `{name}` in the hex."""

    name: str

    @property
    def marker(self) -> str:
        return f"\x00capture:{self.name}\x00"


def _with_captures(value: Any, shown: Callable[[Cap], str]) -> Any:
    """`value` with each Cap in it (at any depth) replaced by `shown(cap)`."""
    if isinstance(value, Cap):
        return shown(value)
    if isinstance(value, list):
        return [_with_captures(v, shown) for v in value]
    if isinstance(value, dict):
        return {k: _with_captures(v, shown) for k, v in value.items()}
    return value


def _hex(value: Any) -> str:
    """The msgpack of `value` as hex, each Cap written as `{name}` in place of its string's bytes."""
    names: set[str] = set()

    def marked(cap: Cap) -> str:
        names.add(cap.name)
        return cap.marker

    encoded = msgspec.msgpack.encode(_with_captures(value, marked)).hex()
    for name in names:
        encoded = encoded.replace(msgspec.msgpack.encode(Cap(name).marker).hex(), "{" + name + "}")
    return encoded


def _named(value: Any) -> Any:
    """A value for the JSON `message`: a Cap as its `{name}` placeholder."""
    return _with_captures(value, lambda cap: "{" + cap.name + "}")


@dataclass
class Msg:
    """A header: its wire array, and (when it is a valid message) its fields by name, defaults filled in."""

    wire: Any  # an array, or (to show it refused) anything else
    named: dict | None
    canonical: bool = True


def msg(tag: str, *args: Any, full: bool = False, canonical: bool = True, **kwargs: Any) -> Msg:
    """The header of a valid message: fields given by position or name. Trailing fields holding their default
    are left out, as a sender may, unless `full` (cronoq's own encoder writes every field: only then is the
    header `canonical`, byte for byte what cronoq would send)."""
    spec = FIELDS[tag]
    given = {**dict(zip([name for name, _ in spec], args)), **kwargs}
    fields = {name: given.get(name, default) for name, default in spec}
    assert all(v is not REQUIRED for v in fields.values()), f"{tag}: a required field is missing"
    sent = len(spec)
    while not full and sent and _holds_default(fields[spec[sent - 1][0]], spec[sent - 1][1]):
        sent -= 1
    return Msg([tag, 1, *[fields[name] for name, _ in spec[:sent]]], {"tag": tag, "v": 1, **fields},
               canonical and sent == len(spec))


def _holds_default(value: Any, default: Any) -> bool:
    return default is not REQUIRED and type(value) is type(default) and value == default


def raw(*wire: Any) -> Msg:
    """A header that is not a valid message as a whole: it is sent as written."""
    return Msg(list(wire), None)


def batch(*items: tuple[Msg, bytes | None], version: int = 1) -> Msg:
    """A batch of (header, body) items; the whole is a valid message only when every item is."""
    wire = ["batch", version, [[item.wire, body] for item, body in items]]
    valid = version == 1 and all(item.named is not None for item, _ in items)
    named = {"tag": "batch", "v": 1, "items": [[item.named, None if body is None else body.hex()]
                                                for item, body in items]} if valid else None
    return Msg(wire, named, all(item.canonical for item, _ in items))


def body(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


# Reply patterns (see the README): plain JSON values are matched exactly, objects are matchers.
TASK_ID = {"type": "string", "match": "^[0-9a-f]{32}$"}
STRING = {"type": "string"}
FLOAT = {"type": "float", "min": 1e9}  # a Unix time


def cap(name: str) -> dict:
    return {**TASK_ID, "capture": name}


def same(name: str) -> dict:
    return {"same": name}


def says(text: str) -> dict:
    return {"type": "string", "contains": text}


def reply(*header: Any, body: bytes | None = None) -> dict:
    out: dict[str, Any] = {"header": list(header)}
    if not _has_matcher(list(header)):
        out["hex"] = msgspec.msgpack.encode(list(header)).hex()
    out["body"] = None if body is None else body.hex()
    return out


def accepted(rid: int, task_id: Any, duplicate: bool = False) -> dict:
    return reply("accepted", 1, rid, task_id, duplicate)


def ok(rid: int, value: Any) -> dict:
    return reply("ok", 1, rid, value)


def outcome(rid: int, task_id: Any, state: str, error_type: Any = "", error_message: Any = "", traceback: Any = "",
            body: bytes | None = None) -> dict:
    return reply("outcome", 1, rid, task_id, state, error_type, error_message, traceback, body=body)


def info(rid: int, task_id: Any, pool: str, tenant: str | None, priority: str, state: str, attempts: int,
         started_at: Any = None, finished_at: Any = None, deadline: Any = None, error: Any = None,
         cost: Any = None) -> dict:
    return reply("info", 1, rid, task_id, pool, tenant, priority, state, attempts, FLOAT, started_at, finished_at,
                 deadline, error, cost)


def welcome(rid: int) -> dict:
    """What brokers/*.toml make a welcome say: heartbeat_interval 5.0, liveness 30, max_payload_bytes 4096."""
    return reply("welcome", 1, rid, 5.0, 30, 4096)


def task(name: str, body: bytes) -> dict:
    """The first attempt of a normal-priority task without a tenant in pool work, captured as `name`."""
    return reply("task", 1, same(name), 1, "work", None, "normal", body=body)


def error(rid: int, code: str, text: str | None = None, details: Any = None) -> dict:
    return reply("error", 1, rid, code, says(text) if text else STRING, details)


def _has_matcher(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    if isinstance(value, list):
        return any(_has_matcher(v) for v in value)
    return False


@dataclass
class Vector:
    about: str
    broker: str = "open"
    peers: dict[str, str] = field(default_factory=lambda: {"client": "clients"})
    steps: list[dict] = field(default_factory=list)

    def send(self, peer: str, header: Msg, body: bytes | None = None, *, token: bytes = b"",
             frames: list[bytes] | None = None, expect: dict[str, list[dict]] | None = None,
             note: str | None = None) -> "Vector":
        """One step: `peer` sends [token, header(, body)] (or exactly `frames`, the header among them given as
        `header`) and then receives `expect` (replies per peer, in order)."""
        step: dict[str, Any] = {"peer": peer}
        if note:
            step["note"] = note
        header_hex = _hex(header.wire)
        if frames is None:
            step["send"] = [token.hex(), header_hex] + ([] if body is None else [body.hex()])
        else:
            step["send"] = [header_hex if f is None else f.hex() for f in frames]
            if None not in frames:
                header = Msg(header.wire, None)  # the header is not sent at all
        step["message"] = None if header.named is None else _named(header.named)
        if header.named is not None and not header.canonical:
            step["canonical"] = False
        step["expect"] = expect or {}
        self.steps.append(step)
        return self

    def refused(self, peer: str, header: Msg, body: bytes | None = None, *, rid: int, code: str = "INVALID_ARGUMENT",
                text: str | None = None, details: Any = None, **kwargs: Any) -> "Vector":
        """One step whose sender gets one error: under `rid`, of `code`, its message containing `text`."""
        return self.send(peer, header, body, expect={peer: [error(rid, code, text, details)]}, **kwargs)

    def to_json(self) -> dict:
        return {"about": self.about, "broker": self.broker, "peers": self.peers, "steps": self.steps}


CASES: dict[str, Vector] = {}


def case(name: str, about: str, **kwargs: Any) -> Vector:
    assert name not in CASES
    vector = CASES[name] = Vector(about, **kwargs)
    return vector


# ----------------------------------------------------------------------------- the cases: requests and replies

W = {"client": "clients", "worker": "workers"}
OK_PAYLOAD = body({"prompt": "hi"})

case("ping", "A ping is answered with ok and the protocol version, 1.") \
    .send("client", msg("ping", 1), expect={"client": [ok(1, 1)]})

case("open-broker-takes-any-token", "A broker without tokens ignores the token frame, whatever it holds.") \
    .send("client", msg("ping", 2), token=b"anything at all", expect={"client": [ok(2, 1)]})

case("hello", "hello returns the broker's rules: the protocol version and max_payload_bytes (4096 in open.toml).") \
    .send("client", msg("hello", 3), expect={"client": [
        ok(3, {"type": "map", "has": {"protocol": 1, "max_payload_bytes": 4096}})]})

case("cluster-lone-broker",
     "A broker that is no member of a cluster answers `cluster` with ok and nil, on either endpoint; its hello "
     "names no member.", peers=W) \
    .send("client", msg("cluster", 4000), expect={"client": [ok(4000, None)]}) \
    .send("worker", msg("cluster", 4001), expect={"worker": [ok(4001, None)]})

CLUSTER_MAP = {
    "version": {"type": "string", "match": "^[0-9a-f]{16}$"}, "member": "b1", "draining": [],
    "members": [
        {"type": "map", "has": {"name": "b1", "clients": ["tcp://b1.example:5555"],
                                "workers": ["tcp://b1.example:5556"], "pools": ["mine"]}},
        {"type": "map", "has": {"name": "b2", "clients": ["tcp://b2.example:5555", "tcp://b2-standby.example:5555"],
                                "workers": ["tcp://b2.example:5556", "tcp://b2-standby.example:5556"],
                                "pools": ["theirs"]}},
    ],
}

case("cluster-member",
     "A cluster member (brokers/cluster.toml, member b1) names itself in hello, answers `cluster` with the map "
     "on either endpoint, makes task ids that start with its name and a colon, and refuses a submit, pause or "
     "resume for another member's pool with FAILED_PRECONDITION whose details name the owner.",
     broker="cluster", peers=W) \
    .send("client", msg("hello", 4010), expect={"client": [
        ok(4010, {"type": "map", "has": {"protocol": 1, "max_payload_bytes": 4096, "member": "b1"}})]}) \
    .send("client", msg("cluster", 4011), expect={"client": [ok(4011, {"type": "map", "has": CLUSTER_MAP})]}) \
    .send("worker", msg("cluster", 4012), expect={"worker": [ok(4012, {"type": "map", "has": CLUSTER_MAP})]}) \
    .send("client", msg("submit", 4013, "mine"), OK_PAYLOAD, expect={"client": [
        accepted(4013, {"type": "string", "match": "^b1:[0-9a-f]{32}$"})]}) \
    .refused("client", msg("submit", 4014, "theirs"), OK_PAYLOAD, rid=4014, code="FAILED_PRECONDITION",
             text="belongs to cluster member 'b2'", details={"type": "map", "has": {"member": "b2", "pool": "theirs"}}) \
    .refused("client", msg("pause", 4015, "theirs"), rid=4015, code="FAILED_PRECONDITION",
             details={"type": "map", "has": {"member": "b2", "pool": "theirs"}}) \
    .refused("worker", msg("ready", 4016, ["mine", "theirs"], 1, concurrency=1), rid=4016,
             code="FAILED_PRECONDITION", details={"type": "map", "has": {"member": "b2", "pool": "theirs"}})

case("submit-minimal", "A submit with only its rid: every other field takes its default.") \
    .send("client", msg("submit", 4), OK_PAYLOAD, expect={"client": [accepted(4, TASK_ID)]})

case("submit-every-field", "A submit with every field present, the trailing default (watch false) included, as "
     "cronoq's own client writes it; the other vectors mostly leave trailing defaults out. A receiver reads both.") \
    .send("client", msg("submit", 5, "default", "acme", "high", 60.0, 0.5, "vector-every-field", 2,
                        "vector-every-field-1", full=True), OK_PAYLOAD,
          expect={"client": [accepted(5, TASK_ID)]})

case("submit-with-cost", "A submit with a cost: what the task charges its tenant's share in a pool that shares by "
     "cost (docs/scheduling.md). Left out, or nil, it is 1; a broker that does not know the field reads the rest.") \
    .send("client", msg("submit", 8, tenant="acme", cost=20.0), OK_PAYLOAD,
          expect={"client": [accepted(8, TASK_ID)]}) \
    .refused("client", msg("submit", 9, cost=-1.0), OK_PAYLOAD, rid=9, code="INVALID_ARGUMENT", text="cost must be")

case("submit-int-for-float", "A float field (deadline) takes an integer too.") \
    .send("client", msg("submit", 6, deadline=60, canonical=False), OK_PAYLOAD,
          expect={"client": [accepted(6, TASK_ID)]})

case("submit-without-body-runs-with-nil-payload",
     "The body frame is optional: a submit without one queues a task whose payload is nil, and the worker gets "
     "the body c0. The whole exchange of a task: ready, welcome, task, done, and the watched outcome.", peers=W) \
    .send("client", msg("submit", 7, "work", watch=True), expect={"client": [accepted(7, cap("task"))]}) \
    .send("worker", msg("ready", 1, ["work"], 1, concurrency=1), expect={"worker": [
        welcome(1), task("task", body=b"\xc0")]}) \
    .send("worker", msg("done", Cap("task"), 1, True), body("hi back"), expect={"client": [
        outcome(7, same("task"), "succeeded", body=body("hi back"))]}) \
    .send("worker", msg("bye"))

case("submit-outcome-only",
     "A watched submit with outcome_only, as `Client.call` sends it: no `accepted`, the outcome is the only reply "
     "(a broker that does not know the field reads the rest, and answers `accepted` first).", peers=W) \
    .send("client", msg("submit", 21, "work", watch=True, outcome_only=True), OK_PAYLOAD, expect={}) \
    .send("worker", msg("ready", 1, ["work"], 1, concurrency=1), expect={"worker": [
        welcome(1), reply("task", 1, cap("task"), 1, "work", None, "normal", body=OK_PAYLOAD)]}) \
    .send("worker", msg("done", Cap("task"), 1, True), body("hi back"), expect={"client": [
        outcome(21, same("task"), "succeeded", body=body("hi back"))]}) \
    .send("worker", msg("bye"))

case("submit-duplicate-submission",
     "A submit repeating an earlier one's submission id is that submit sent again: it returns the first task, "
     "answered as the first was (duplicate false: only a key of the caller's makes a duplicate).") \
    .send("client", msg("submit", 8, submission="vector-dup-1"), OK_PAYLOAD,
          expect={"client": [accepted(8, cap("first"))]}) \
    .send("client", msg("submit", 9, submission="vector-dup-1"), OK_PAYLOAD,
          expect={"client": [accepted(9, same("first"), False)]}) \
    .send("client", msg("submit", 12, tenant="acme", key="vector-key-2", submission="vector-dup-2"), OK_PAYLOAD,
          expect={"client": [accepted(12, cap("keyed"))]}) \
    .send("client", msg("submit", 13, tenant="acme", key="vector-key-2", submission="vector-dup-3"), OK_PAYLOAD,
          expect={"client": [accepted(13, same("keyed"), True)]}) \
    .send("client", msg("submit", 14, tenant="acme", key="vector-key-2", submission="vector-dup-3"), OK_PAYLOAD,
          expect={"client": [accepted(14, same("keyed"), True)]})

case("submit-duplicate-key", "A second submit with the same key in the same pool and tenant returns the first task.") \
    .send("client", msg("submit", 10, tenant="acme", key="vector-key-1"), OK_PAYLOAD,
          expect={"client": [accepted(10, cap("first"))]}) \
    .send("client", msg("submit", 11, tenant="acme", key="vector-key-1"), body("another"),
          expect={"client": [accepted(11, same("first"), True)]})

case("status-cancel-wait",
     "status answers info (submitted_at a Unix time; deadline the absolute Unix time, though submit took seconds "
     "from now; started_at and finished_at nil). cancel of a queued task answers true, and false once it has "
     "ended; info then shows the error as one string; wait of a finished task answers at once. A cancelled "
     "outcome carries error_type Cancelled and an empty traceback.") \
    .send("client", msg("submit", 12, tenant="acme", deadline=600.0, delay=300.0), OK_PAYLOAD,
          expect={"client": [accepted(12, cap("task"))]}) \
    .send("client", msg("status", 13, Cap("task")), expect={"client": [
        info(13, same("task"), "default", "acme", "normal", "delayed", 0, None, None, FLOAT)]}) \
    .send("client", msg("cancel", 14, Cap("task")), expect={"client": [ok(14, True)]}) \
    .send("client", msg("status", 15, Cap("task")), expect={"client": [
        info(15, same("task"), "default", "acme", "normal", "cancelled", 0, None, FLOAT, FLOAT,
              "Cancelled: the task was cancelled")]}) \
    .send("client", msg("cancel", 16, Cap("task")), expect={"client": [ok(16, False)]}) \
    .send("client", msg("wait", 17, Cap("task")), expect={"client": [
        outcome(17, same("task"), "cancelled", "Cancelled", "the task was cancelled")]})

case("explain",
     "explain answers ok with a map: the task's fields as info has them, history (how each attempt ended: none "
     "yet) and waiting (what stands before it; here its delay, and no worker serving default; default shares "
     "nothing fairly, so no tenant nodes; how many tasks of higher classes are queued there depends on the vectors "
     "run before it on the same broker). An unknown id is "
     "NOT_FOUND, as for status (and so is another tenant's task, to a token pinned to a tenant).") \
    .send("client", msg("submit", 150, tenant="acme", delay=300.0), OK_PAYLOAD,
          expect={"client": [accepted(150, cap("task"))]}) \
    .send("client", msg("explain", 151, Cap("task")), expect={"client": [
        ok(151, {"type": "map", "has": {
            "id": same("task"), "pool": "default", "tenant": "acme", "priority": "normal", "state": "delayed",
            "attempts": 0, "submitted_at": FLOAT, "not_before": FLOAT, "history": [],
            "waiting": {"type": "map", "has": {
                "delayed_for": {"type": "float"}, "retry": False, "paused": False, "workers": 0,
                "higher_classes_ahead": {"type": "int"}, "queue_ahead": None, "estimate": None,
                "estimate_note": says("no worker serves pool 'default'"),
                "fair": False, "nodes": []}}}})]}) \
    .refused("client", msg("explain", 152, "0123456789abcdef0123456789abcdef"), rid=152, code="NOT_FOUND")

case("watched-submit-cancelled",
     "A watched task that is cancelled: its outcome comes under the submit's rid, before the cancel's ok.") \
    .send("client", msg("submit", 18, watch=True), OK_PAYLOAD, expect={"client": [accepted(18, cap("task"))]}) \
    .send("client", msg("cancel", 19, Cap("task")), expect={"client": [
        outcome(18, same("task"), "cancelled", "Cancelled", "the task was cancelled"),
        ok(19, True)]})

case("deadline-expires",
     "A task not dispatched by its deadline (0.05 s here; no worker serves default) expires: error_type "
     "DeadlineExceeded.") \
    .send("client", msg("submit", 20, deadline=0.05, watch=True), OK_PAYLOAD, expect={"client": [
        accepted(20, cap("task")),
        outcome(20, same("task"), "expired", "DeadlineExceeded",
              "the task's deadline passed before it was dispatched")]})

case("wait-unwait",
     "unwait has no reply; a wait for a task that does not exist is NOT_FOUND under its rid.") \
    .send("client", msg("submit", 21), OK_PAYLOAD, expect={"client": [accepted(21, cap("task"))]}) \
    .send("client", msg("wait", 22, Cap("task"))) \
    .send("client", msg("unwait", 22, Cap("task"))) \
    .refused("client", msg("wait", 23, "0123456789abcdef0123456789abcdef"), rid=23, code="NOT_FOUND")

case("pause-resume", "pause and resume answer ok true, also for a pool already paused (or running); an undeclared "
     "pool is NOT_FOUND.") \
    .send("client", msg("pause", 24, "held"), expect={"client": [ok(24, True)]}) \
    .send("client", msg("pause", 29, "held"), expect={"client": [ok(29, True)]}) \
    .send("client", msg("resume", 25, "held"), expect={"client": [ok(25, True)]}) \
    .refused("client", msg("pause", 26, "no-such-pool"), rid=26, code="NOT_FOUND", text="no-such-pool")

INT, BOOL, MAP = {"type": "int"}, {"type": "bool"}, {"type": "map"}
PRIORITY_NAMES = ("critical", "high", "normal", "low")
CLASS_STATS = {"type": "map", "has": {"queued": INT, "delayed": INT, "running": INT, "dispatched": INT}}

case("stats", "stats answers ok with a map: pools (per pool: its state and counts, per class and per tenant), "
     "workers, late_results, schedules, memory and store (docs/protocol.md, \"The stats map\").") \
    .send("client", msg("stats", 27), expect={"client": [
        ok(27, {"type": "map", "has": {
            "pools": {"type": "map", "has": {"default": {"type": "map", "has": {
                "paused": BOOL, "draining": BOOL, "fair": BOOL, "max_in_flight": {"type": "any"}, "queued": INT,
                "delayed": INT, "running": INT, "dispatched": INT, "workers": INT, "ready_workers": INT,
                "classes": {"type": "map", "has": {name: CLASS_STATS for name in PRIORITY_NAMES}},
                "tenants": MAP, "tenant_count": INT, "ceilings": MAP, "ceiling_count": INT,
                "dispatch_rate": {"type": "float"}}}}},
            "workers": INT, "late_results": INT, "schedules": MAP, "memory": MAP, "store": MAP}})]})

case("reload", "reload rereads the config file and answers what changed: here, nothing.") \
    .send("client", msg("reload", 28), expect={"client": [
        ok(28, {"type": "map", "has": {"pools_added": [], "pools_draining": [], "needs_restart": []}})]})

# ----------------------------------------------------------------------------- batches

case("batch-of-requests",
     "A batch of requests: each answered under its rid, in order. Bodies travel inside as msgpack bin holding the "
     "encoded body; a message without a body has nil.") \
    .send("client", batch((msg("ping", 30), None), (msg("submit", 31), OK_PAYLOAD), (msg("hello", 32), None)),
          expect={"client": [ok(30, 1), accepted(31, TASK_ID),
                             ok(32, {"type": "map", "has": {"protocol": 1}})]})

case("batch-one-ill-typed-item",
     "One ill-typed item (pool an integer) is refused under its own rid; the items around it are answered.") \
    .send("client", batch((msg("ping", 33), None), (raw("submit", 1, 34, 77), OK_PAYLOAD), (msg("ping", 35), None)),
          expect={"client": [ok(33, 1), error(34, "INVALID_ARGUMENT", "item 2"), ok(35, 1)]})

case("batch-items-refused-each-for-itself",
     "Every kind of unreadable item, each refused on its own: a version other than 1, an int where a bool goes, a "
     "body that is a str instead of bin, a body that is bin but not msgpack, a batch inside the batch, an unknown "
     "tag, and an item that is not a [header, body] array (no rid can be read: rid 0).") \
    .send("client", Msg(["batch", 1, [
        [["ping", 2, 40], None],
        [["submit", 1, 41, "default", None, "normal", None, None, None, 0, None, 1], OK_PAYLOAD],
        [["submit", 1, 42], "not bin"],
        [["submit", 1, 43], b"\xc1"],
        [["batch", 1, [[["ping", 1, 44], None]]], None],
        [["nope", 1, 45], None],
        17,
        [["ping", 1, 46], None],
    ]], None), expect={"client": [
        error(40, "INVALID_ARGUMENT", "unsupported protocol version 2"), error(41, "INVALID_ARGUMENT", "bool"),
        error(42, "INVALID_ARGUMENT", "bytes"), error(43, "INVALID_ARGUMENT", "not one msgpack document"),
        error(0, "INVALID_ARGUMENT"), error(45, "INVALID_ARGUMENT"), error(0, "INVALID_ARGUMENT"),
        ok(46, 1)]})

case("batch-followed-by-a-body-frame", "A batch followed by a body frame is refused whole, under rid 0.") \
    .send("client", batch((msg("ping", 47), None), (msg("ping", 48), None)), b"\xc0",
          expect={"client": [error(0, "INVALID_ARGUMENT", "no body frame")]})

case("batch-of-another-version", "A batch whose own version is not 1 is refused whole, under rid 0.") \
    .send("client", batch((msg("ping", 49), None), version=2),
          expect={"client": [error(0, "INVALID_ARGUMENT", "unsupported protocol version 2")]})

# ----------------------------------------------------------------------------- validation and rid rules

case("rid-echoed-when-the-version-is-a-string", "The version must be the integer 1; the error still carries the rid.") \
    .send("client", raw("ping", "1", 50), expect={"client": [error(50, "INVALID_ARGUMENT")]})

case("rid-echoed-for-another-version", "A version other than 1 is refused, under the message's rid.") \
    .refused("client", raw("ping", 2, 51), rid=51, text="unsupported protocol version")

case("rid-echoed-for-an-unknown-tag", "An unknown tag is refused under the rid the header shows, naming the tag.") \
    .refused("client", raw("nope", 1, 52), rid=52, text="unknown tag 'nope'")

case("rid-unreadable", "A rid that is not an integer cannot be echoed: rid 0.") \
    .send("client", raw("ping", 1, "53"), expect={"client": [error(0, "INVALID_ARGUMENT")]})

case("header-not-an-array", "A header that is not an array: rid 0.") \
    .refused("client", Msg({"tag": "ping"}, None), rid=0)

case("extra-trailing-fields-ignored", "Extra trailing elements are ignored.") \
    .send("client", Msg(["ping", 1, 54, "extra", 7], {"tag": "ping", "v": 1, "rid": 54}, canonical=False),
          expect={"client": [ok(54, 1)]})

case("frame-count",
     "A message needs 2 or 3 frames. With 1 there is no header: rid 0. With 4 the header is still read for its rid. "
     "The first message makes the connection known (until then it would earn one error a second).") \
    .send("client", msg("ping", 55), expect={"client": [ok(55, 1)]}) \
    .refused("client", msg("ping", 56), frames=[b""], rid=0, text="2 or 3 frames") \
    .send("client", msg("ping", 57), frames=[b"", None, b"\xc0", b"\xc0"],
          expect={"client": [error(57, "INVALID_ARGUMENT", "2 or 3 frames")]})

case("types-are-strict",
     "An int where a bool goes, a bool where an int or a float goes, a float where an int goes, bin where a string "
     "goes: each refused under its rid.") \
    .send("client", msg("ping", 60), expect={"client": [ok(60, 1)]}) \
    .send("client", raw("submit", 1, 61, "default", None, "normal", None, None, None, 0, None, 1), OK_PAYLOAD,
          expect={"client": [error(61, "INVALID_ARGUMENT", "Expected `bool`, got `int`")]}) \
    .send("client", raw("submit", 1, 62, "default", None, "normal", None, None, None, True), OK_PAYLOAD,
          expect={"client": [error(62, "INVALID_ARGUMENT", "Expected `int`, got `bool`")]}) \
    .send("client", raw("submit", 1, 63, "default", None, "normal", True), OK_PAYLOAD,
          expect={"client": [error(63, "INVALID_ARGUMENT", "got `bool`")]}) \
    .send("client", raw("submit", 1, 64, "default", None, "normal", None, None, None, 1.0), OK_PAYLOAD,
          expect={"client": [error(64, "INVALID_ARGUMENT", "Expected `int`, got `float`")]}) \
    .send("client", raw("submit", 1, 65, b"default"), OK_PAYLOAD,
          expect={"client": [error(65, "INVALID_ARGUMENT", "Expected `str`, got `bytes`")]})

case("submit-values",
     "Values the types allow but the rules do not: each refused under its rid, naming the field.") \
    .send("client", msg("ping", 70), expect={"client": [ok(70, 1)]}) \
    .refused("client", msg("submit", 71, priority="urgent"), OK_PAYLOAD, rid=71, text="priority") \
    .refused("client", msg("submit", 72, deadline=0.0), OK_PAYLOAD, rid=72, text="deadline") \
    .refused("client", msg("submit", 73, delay=-1.0), OK_PAYLOAD, rid=73, text="delay") \
    .refused("client", msg("submit", 74, max_retries=1001), OK_PAYLOAD, rid=74, text="max_retries") \
    .refused("client", msg("submit", 75, key="cronoq:mine"), OK_PAYLOAD, rid=75, text="cronoq:") \
    .refused("client", msg("submit", 76, ""), OK_PAYLOAD, rid=76, text="pool") \
    .refused("client", msg("submit", 77, "no-such-pool"), OK_PAYLOAD, rid=77, code="NOT_FOUND", text="no-such-pool") \
    .refused("client", msg("submit", 78, tenant="x" * 201), OK_PAYLOAD, rid=78, text="tenant")

case("submit-body-must-be-msgpack",
     "A body that is not exactly one msgpack document is refused: an unused type byte, a truncated array, two "
     "documents, JSON text. One over max_payload_bytes (4096) is refused for its size.") \
    .send("client", msg("ping", 80), expect={"client": [ok(80, 1)]}) \
    .refused("client", msg("submit", 81), b"\xc1", rid=81, text="not one msgpack document") \
    .refused("client", msg("submit", 82), b"\x92\x01", rid=82, text="not one msgpack document") \
    .refused("client", msg("submit", 83), b"\x01\x02", rid=83, text="not one msgpack document") \
    .refused("client", msg("submit", 84), b'{"json": true}', rid=84, text="not one msgpack document") \
    .refused("client", msg("submit", 85), body(b"x" * 5000), rid=85, text="max_payload_bytes")

case("unknown-connection-earns-one-error-a-second",
     "A connection that has not had a message taken earns at most one error a second: the second bad message, "
     "sent at once, gets no answer.") \
    .send("client", raw("ping", 1, "x"), expect={"client": [error(0, "INVALID_ARGUMENT")]}) \
    .send("client", raw("ping", 1, "y"))

# ----------------------------------------------------------------------------- tokens (secured.toml)

case("token-missing", "A broker with tokens refuses a message without one, under the message's rid.",
     broker="secured") \
    .send("client", msg("ping", 90), expect={"client": [error(90, "UNAUTHENTICATED")]})

case("token-unknown-batch",
     "A batch with an unknown token earns exactly one error, under rid 0, whatever it holds; none of it is done.",
     broker="secured") \
    .send("client", batch((msg("ping", 91), None), (msg("submit", 92), OK_PAYLOAD), (msg("ping", 93), None)),
          token=b"not-a-token", expect={"client": [error(0, "UNAUTHENTICATED", "unknown token")]})

case("token-role-per-request",
     "On the client endpoint a role is checked per request: a client token's pause is PERMISSION_DENIED under its "
     "rid, its ping in the same batch is answered.", broker="secured") \
    .send("client", batch((msg("ping", 94), None), (msg("pause", 95, "held"), None)), token=TOKENS["client"],
          expect={"client": [ok(94, 1), error(95, "PERMISSION_DENIED")]})

case("token-pinned-tenant",
     "A token pinned to tenant acme may not submit for another tenant; without a tenant, its task is acme's.",
     broker="secured") \
    .send("client", msg("submit", 96, tenant="globex"), OK_PAYLOAD, token=TOKENS["client"],
          expect={"client": [error(96, "PERMISSION_DENIED", "acme")]}) \
    .send("client", msg("submit", 97), OK_PAYLOAD, token=TOKENS["client"],
          expect={"client": [accepted(97, cap("task"))]}) \
    .send("client", msg("status", 98, Cap("task")), token=TOKENS["client"], expect={"client": [
        info(98, same("task"), "default", "acme", "normal", "queued", 0)]})

case("token-one-per-connection",
     "A connection speaks for the first valid token it showed: another valid token on it is PERMISSION_DENIED.",
     broker="secured", peers={"admin": "clients"}) \
    .send("admin", msg("ping", 99), token=TOKENS["admin"], expect={"admin": [ok(99, 1)]}) \
    .refused("admin", msg("ping", 100), token=TOKENS["client"], rid=100, code="PERMISSION_DENIED")

case("worker-ready-refused-for-its-token",
     "A ready refused for its token carries the ready's rid: a client token may not serve; no token is "
     "UNAUTHENTICATED. A worker token is welcomed.", broker="secured",
     peers={"rogue": "workers", "anonymous": "workers", "worker": "workers"}) \
    .send("rogue", msg("ready", 101, ["work"], 1), token=TOKENS["client"],
          expect={"rogue": [error(101, "PERMISSION_DENIED", "serve pools")]}) \
    .refused("anonymous", msg("ready", 102, ["work"], 1), rid=102, code="UNAUTHENTICATED") \
    .send("worker", msg("ready", 103, ["work"], 0), token=TOKENS["worker"],
          expect={"worker": [welcome(103)]}) \
    .send("worker", msg("bye"), token=TOKENS["worker"])

# ----------------------------------------------------------------------------- the worker endpoint

case("worker-heartbeat-before-ready", "A worker the broker does not know is told to register.",
     peers={"worker": "workers"}) \
    .send("worker", msg("heartbeat"), expect={"worker": [reply("reregister", 1)]}) \
    .send("worker", msg("bye"))

case("worker-ready-refused",
     "A refused ready carries its rid: an undeclared pool is NOT_FOUND; no pools, or negative slots, "
     "INVALID_ARGUMENT.", peers={"worker": "workers"}) \
    .send("worker", msg("heartbeat"), expect={"worker": [reply("reregister", 1)]}) \
    .refused("worker", msg("ready", 110, ["no-such-pool"], 1), rid=110, code="NOT_FOUND", text="no-such-pool") \
    .refused("worker", msg("ready", 111, [], 1), rid=111, text="at least one pool") \
    .refused("worker", msg("ready", 112, ["work"], -1), rid=112, text="slots") \
    .send("worker", msg("bye"))

case("worker-endpoint-rid-echo",
     "On the worker endpoint too the rid is echoed when it can be read: an unknown tag, a ready whose "
     "version is a string. Messages without a rid (done) never lend their third field as one. A client's "
     "request sent there is refused under rid 0, naming the client endpoint: the client fails every request "
     "it sent to the wrong place.",
     peers={"worker": "workers"}) \
    .send("worker", msg("heartbeat"), expect={"worker": [reply("reregister", 1)]}) \
    .refused("worker", raw("frobnicate", 1, 113), rid=113, text="unknown tag 'frobnicate'") \
    .refused("worker", raw("submit", 1, 116), rid=0, text="this is the broker's worker endpoint") \
    .refused("worker", raw("ready", "1", 114, ["work"], 1), rid=114) \
    .send("worker", raw("done", 1, 115), expect={"worker": [error(0, "INVALID_ARGUMENT")]}) \
    .send("worker", msg("bye"))

case("worker-failure-and-leave",
     "A done with ok false fails the task; the outcome carries the worker's error fields (all present in the "
     "done, even the empty traceback). cancel of a running task answers false. leave is answered with left.",
     peers=W) \
    .send("client", msg("submit", 120, "work", watch=True), OK_PAYLOAD,
          expect={"client": [accepted(120, cap("task"))]}) \
    .send("worker", msg("ready", 121, ["work"], 1), expect={"worker": [
        welcome(121), task("task", body=OK_PAYLOAD)]}) \
    .send("client", msg("cancel", 122, Cap("task")), expect={"client": [ok(122, False)]}) \
    .send("worker", msg("done", Cap("task"), 1, False, "ValueError", "bad input", full=True), expect={"client": [
        outcome(120, same("task"), "failed", "ValueError", "bad input")]}) \
    .send("client", msg("status", 123, Cap("task")), expect={"client": [
        info(123, same("task"), "work", None, "normal", "failed", 1, FLOAT, FLOAT, None,
              "ValueError: bad input")]}) \
    .send("worker", msg("leave"), expect={"worker": [reply("left", 1)]}) \
    .send("worker", msg("bye"))

case("bounds-names-and-ids",
     "Names and ids past their bounds are refused while the header is read, the error naming the field: a task id "
     "over 256 characters, a pool name over 200, a ready naming more than 1,024 pools.", peers=W) \
    .send("client", msg("ping", 140), expect={"client": [ok(140, 1)]}) \
    .refused("client", raw("status", 1, 141, "i" * 257), rid=141, text="`id`") \
    .refused("client", raw("pause", 1, 142, "p" * 201), rid=142, text="`pool`") \
    .send("worker", msg("heartbeat"), expect={"worker": [reply("reregister", 1)]}) \
    .refused("worker", raw("ready", 1, 143, ["p" * 201], 1), rid=143, text="`pools`") \
    .refused("worker", raw("ready", 1, 144, ["work"] * 1025, 1), rid=144, text="`pools`") \
    .send("worker", msg("bye"))

case("bounds-failure-text-cut",
     "The broker cuts the text of a failure where the done enters, as cronoq's worker does before sending it: "
     "error_type to 256 bytes, error_message to 8 KiB, traceback to 32 KiB (UTF-8), keeping its start and end "
     "around a line saying how many bytes were cut.", peers=W) \
    .send("client", msg("submit", 150, "work", watch=True), OK_PAYLOAD,
          expect={"client": [accepted(150, cap("task"))]}) \
    .send("worker", msg("ready", 151, ["work"], 1), expect={"worker": [welcome(151), task("task", body=OK_PAYLOAD)]}) \
    .send("worker", msg("done", Cap("task"), 1, False, "E" * 300, "m" * 9000, "t" * 40000), expect={"client": [
        outcome(150, same("task"), "failed", {"type": "string", "match": r"^E+\n\.\.\. \[\d+ bytes cut\] \.\.\.\nE+$"},
                {"type": "string", "match": r"^m+\n\.\.\. \[\d+ bytes cut\] \.\.\.\nm+$"},
                {"type": "string", "match": r"^t+\n\.\.\. \[\d+ bytes cut\] \.\.\.\nt+$"})]}) \
    .send("worker", msg("bye"))

case("worker-result-must-be-msgpack",
     "A done whose result is not one msgpack document fails its task with error_type InvalidArgument; nothing of it "
     "reaches the client. A done without a body reports a nil result.", peers=W) \
    .send("client", batch((msg("submit", 130, "work", watch=True), OK_PAYLOAD),
                          (msg("submit", 131, "work", watch=True), OK_PAYLOAD)),
          expect={"client": [accepted(130, cap("bad")), accepted(131, cap("nil"))]}) \
    .send("worker", msg("ready", 132, ["work"], 2, concurrency=2), expect={"worker": [
        welcome(132),
        task("bad", body=OK_PAYLOAD),
        task("nil", body=OK_PAYLOAD)]}) \
    .send("worker", msg("done", Cap("bad"), 1, True), b"\x92\x01", expect={"client": [
        outcome(130, same("bad"), "failed", "InvalidArgument", says("not one msgpack document"))]}) \
    .send("worker", msg("done", Cap("nil"), 1, True), expect={"client": [
        outcome(131, same("nil"), "succeeded", body=b"\xc0")]}) \
    .send("worker", msg("bye"))

case("worker-batch-one-bad-done",
     "A worker's batch with one unreadable done (attempt a string): that item is refused (rid 0: done has no rid), "
     "the dones around it complete their tasks.", peers=W) \
    .send("client", batch((msg("submit", 140, "work", watch=True), body(1)),
                          (msg("submit", 141, "work", watch=True), body(2))),
          expect={"client": [accepted(140, cap("one")), accepted(141, cap("two"))]}) \
    .send("worker", msg("ready", 142, ["work"], 2, concurrency=2), expect={"worker": [
        welcome(142),
        task("one", body=body(1)),
        task("two", body=body(2))]}) \
    .send("worker", Msg(["batch", 1, [
        [["done", 1, Cap("one"), 1, True], body("one")],
        [["done", 1, Cap("two"), "first", True], body("two")],
        [["done", 1, Cap("two"), 1, True], body("two")],
    ]], None), expect={
        "worker": [error(0, "INVALID_ARGUMENT", "item 2")],
        "client": [outcome(140, same("one"), "succeeded", body=body("one")),
                   outcome(141, same("two"), "succeeded", body=body("two"))]}) \
    .send("worker", msg("bye"))


# ----------------------------------------------------------------------------- writing the files


def rendered() -> dict[str, str]:
    """File name -> the JSON text of each vector."""
    return {f"{name}.json": _dump(vector.to_json()) + "\n" for name, vector in CASES.items()}


def _dump(value: Any, indent: int = 0) -> str:
    """JSON with one level per line, except what fits on a line of 110 characters, which stays on one."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (list, dict)) or not value or len(flat) + indent <= 110:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        inner = [f"{pad}{json.dumps(key)}: {_dump(item, indent + 2)}" for key, item in value.items()]
        return "{\n" + ",\n".join(inner) + "\n" + " " * indent + "}"
    inner = [pad + _dump(item, indent + 2) for item in value]
    return "[\n" + ",\n".join(inner) + "\n" + " " * indent + "]"


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for old in VECTORS.glob("*.json"):
        old.unlink()
    for name, text in rendered().items():
        (VECTORS / name).write_text(text)
    print(f"wrote {len(CASES)} vectors to {VECTORS}")


if __name__ == "__main__":
    main()
