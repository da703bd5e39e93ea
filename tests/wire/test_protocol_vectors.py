"""The shared protocol vectors (docs/protocol-vectors/): replayed against real brokers, and round-tripped.

The replay is what another implementation's runner does (docs/protocol-vectors/README.md): raw DEALER sockets
on 127.0.0.1, the frames of each step sent as written, every reply matched against its pattern. It needs no
part of cronoq but the broker process it talks to.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec
import pytest
import zmq

from cronoq.errors import InvalidArgument
from cronoq.wire import protocol
from tests.wire import protocol_vectors
from tests.support import BrokerProcess, free_port

VECTORS = protocol_vectors.VECTORS
NAMES = sorted(path.stem for path in VECTORS.glob("*.json"))
SECRETS = {"T_CLIENT": "client-secret", "T_WORKER": "worker-secret", "T_ADMIN": "admin-secret"}
REPLY_TIMEOUT = 15.0  # seconds for each expected reply: generous, never a speed assertion
QUIET = 0.3  # seconds a vector's peers must then stay silent


def load(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / f"{name}.json").read_text())


def test_the_vectors_on_disk_are_what_the_cases_write():
    """Edit tests/wire/protocol_vectors.py and run `python -m tests.wire.protocol_vectors`, not the JSON."""
    on_disk = {path.name: path.read_text() for path in VECTORS.glob("*.json")}
    assert on_disk == protocol_vectors.rendered()


# ----------------------------------------------------------------------------- replay against the broker


@pytest.fixture(scope="module")
def brokers(tmp_path_factory) -> Iterator[dict[str, BrokerProcess]]:
    """One broker per config in docs/protocol-vectors/brokers/, on fresh loopback ports, for the whole module."""
    started = {}
    try:
        for name in ("open", "secured", "cluster"):
            text = (VECTORS / "brokers" / f"{name}.toml").read_text()
            endpoints = f'clients = "tcp://127.0.0.1:{free_port()}"\nworkers = "tcp://127.0.0.1:{free_port()}"\n'
            path = tmp_path_factory.mktemp(f"vectors-{name}") / f"{name}.toml"
            path.write_text(text.replace("[broker]\n", "[broker]\n" + endpoints, 1))
            started[name] = BrokerProcess(path, env=SECRETS).start()
        yield started
    finally:
        for broker in started.values():
            broker.stop()


_batch_decoder = msgspec.msgpack.Decoder(tuple[str, int, list[tuple[msgspec.Raw, Optional[bytes]]]])


class Peer:
    """A raw DEALER socket speaking for one peer of a vector."""

    def __init__(self, endpoint: str, is_worker: bool) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.is_worker = is_worker
        self.waiting: list[tuple[bytes, bytes | None]] = []

    def next_item(self, timeout: float) -> tuple[bytes, bytes | None] | None:
        """The next (header, body) the broker sent, batches opened, its heartbeats skipped; None if none came."""
        end = time.monotonic() + timeout
        while not self.waiting:
            left = end - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                return None
            frames = self.sock.recv_multipart()
            if msgspec.msgpack.decode(frames[0])[0] == "batch":
                self.waiting += [(bytes(header), body) for header, body in _batch_decoder.decode(frames[0])[2]]
            else:
                self.waiting.append((frames[0], frames[1] if len(frames) > 1 else None))
            if self.is_worker:
                self.waiting = [item for item in self.waiting if msgspec.msgpack.decode(item[0]) != ["heartbeat", 1]]
        return self.waiting.pop(0)


def matches(pattern: Any, value: Any, captures: dict[str, Any], where: str) -> None:
    """Assert `value` (a decoded msgpack value) matches `pattern` (README: "Matching replies")."""
    if isinstance(pattern, dict):
        kind = pattern.get("type", "any")
        kinds = {"int": int, "float": float, "bool": bool, "string": str, "bin": bytes, "nil": type(None),
                 "array": list, "map": dict}
        if kind != "any":
            assert type(value) is kinds[kind], f"{where}: expected {kind}, got {value!r}"
        if "same" in pattern:
            assert value == captures[pattern["same"]], f"{where}: expected {captures[pattern['same']]!r}, got {value!r}"
        if "match" in pattern:
            assert re.search(pattern["match"], value), f"{where}: {value!r} does not match {pattern['match']}"
        if "contains" in pattern:
            assert pattern["contains"] in value, f"{where}: {value!r} does not contain {pattern['contains']!r}"
        if "min" in pattern:
            assert value >= pattern["min"], f"{where}: {value!r} is under {pattern['min']}"
        for key, item in pattern.get("has", {}).items():
            assert key in value, f"{where}: no key {key!r} in {value!r}"
            matches(item, value[key], captures, f"{where}.{key}")
        if "capture" in pattern:
            captures[pattern["capture"]] = value
    elif isinstance(pattern, list):
        assert isinstance(value, list) and len(value) == len(pattern), f"{where}: expected {pattern!r}, got {value!r}"
        for n, (item, got) in enumerate(zip(pattern, value)):
            matches(item, got, captures, f"{where}[{n}]")
    else:
        assert type(value) is type(pattern) and value == pattern, f"{where}: expected {pattern!r}, got {value!r}"


def filled(hex_text: str, captures: dict[str, Any]) -> bytes:
    """A frame's bytes, each {name} replaced by the msgpack of the string captured under that name."""
    return bytes.fromhex(re.sub(r"\{(\w+)\}", lambda m: msgspec.msgpack.encode(captures[m[1]]).hex(), hex_text))


@pytest.mark.parametrize("name", NAMES)
def test_the_broker_answers_each_vector_as_it_says(brokers, name):
    vector = load(name)
    broker = brokers[vector["broker"]]
    endpoints = {"clients": broker.clients, "workers": broker.workers}
    peers = {peer: Peer(endpoints[endpoint], endpoint == "workers") for peer, endpoint in vector["peers"].items()}
    captures: dict[str, Any] = {}
    try:
        for n, step in enumerate(vector["steps"], 1):
            peers[step["peer"]].sock.send_multipart([filled(frame, captures) for frame in step["send"]])
            for peer, expected in step["expect"].items():
                for k, want in enumerate(expected, 1):
                    where = f"{name} step {n}, {peer}'s reply {k}"
                    got = peers[peer].next_item(REPLY_TIMEOUT)
                    assert got is not None, f"{where}: nothing came; expected {want['header']}"
                    header, body = got
                    matches(want["header"], msgspec.msgpack.decode(header), captures, where)
                    if "hex" in want:
                        assert header.hex() == want["hex"], f"{where}: other bytes than the vector's"
                    assert body == (None if want["body"] is None else bytes.fromhex(want["body"])), f"{where}: body"
        time.sleep(QUIET)
        for peer_name, peer in peers.items():
            extra = peer.next_item(0.0)
            assert extra is None, f"{name}: {peer_name} got more than the vector says: {msgspec.msgpack.decode(extra[0])}"
    finally:
        for peer in peers.values():
            peer.sock.close(linger=0)
    assert broker.proc.poll() is None, "the broker died"


# ----------------------------------------------------------------------------- round trips through cronoq.wire.protocol

DUMMY_ID = "0123456789abcdef" * 2
STRICT = {"clients": (protocol.decode_client_request, protocol.decode_client_reply),
          "workers": (protocol.decode_worker_message, protocol.decode_worker_command)}


def named(message: Any) -> dict[str, Any]:
    """A decoded message by field name, as a vector's `message` writes it."""
    out = {"tag": type(message).__struct_config__.tag}
    for field in message.__struct_fields__:
        value = getattr(message, field)
        if field == "items":
            value = [[named(item), None if body is None else body.hex()] for item, body in value]
        out[field] = value
    return out


def _dummies(value: Any) -> Any:
    """A vector's `message` with each {name} placeholder as the id the round trip fills in."""
    if isinstance(value, str):
        return re.sub(r"\{\w+\}", DUMMY_ID, value)
    if isinstance(value, list):
        return [_dummies(v) for v in value]
    if isinstance(value, dict):
        return {k: _dummies(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("name", NAMES)
def test_every_message_of_a_vector_round_trips_through_the_python_protocol(name):
    vector = load(name)
    dummies = _Dummies()
    for n, step in enumerate(vector["steps"], 1):
        where = f"{name} step {n}"
        read_request, read_reply = STRICT[vector["peers"][step["peer"]]]
        if len(step["send"]) >= 2:
            header = filled(step["send"][1], dummies)
            if step["message"] is None:  # refused as a whole by a strict reader
                with pytest.raises(InvalidArgument):
                    read_request(header)
            else:
                message = read_request(header)
                assert named(message) == _dummies(step["message"]), where
                again = protocol.encode(message)
                assert read_request(again) == message, where
                if step.get("canonical", True):
                    assert again == header, f"{where}: cronoq encodes it otherwise"
        for peer, expected in step["expect"].items():
            read = STRICT[vector["peers"][peer]][1]
            for want in expected:
                if "hex" in want:  # a reply the vector fixes byte for byte reads and encodes back the same
                    header = bytes.fromhex(want["hex"])
                    assert protocol.encode(read(header)) == header, where
                    matches(want["header"], msgspec.msgpack.decode(header), {}, where)


class _Dummies(dict):
    """Every capture name stands for the same dummy id."""

    def __missing__(self, key: str) -> str:
        return DUMMY_ID


def test_the_readme_names_every_matcher_the_vectors_use():
    readme = (VECTORS / "README.md").read_text()
    used: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):  # a matcher: its keys are the README's words; `has` holds patterns by map key
            used.update(value)
            for item in value.get("has", {}).values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for name in NAMES:
        for step in load(name)["steps"]:
            for expected in step["expect"].values():
                for want in expected:
                    walk(want["header"])
    assert used and all(f"`{key}`" in readme for key in used), used
