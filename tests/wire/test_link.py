"""cronoq.wire.link: the monitor's events in, the link's state and the sentence naming its trouble out (no sockets)."""

from __future__ import annotations

import zmq

import pytest

from cronoq.errors import InvalidArgument
from cronoq.wire.link import HANDSHAKE_FAILURES_FINAL, REFUSED_GRACE, Link, Links, parse_addresses

ADDR = "tcp://127.0.0.1:5555"
CONNECTED, RETRIED, DISCONNECTED = zmq.EVENT_CONNECTED, zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_DISCONNECTED
SUCCEEDED, NO_DETAIL, PROTOCOL = (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                  zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH


def feed(link: Link, *events: tuple[int, int, float]) -> Link:
    for event, value, now in events:
        link.observe(int(event), int(value), now)
    return link


def refused(now: float) -> tuple[int, int, float]:
    return (RETRIED, 100, now)  # no CONNECTED since the last retry: nobody took the connection


def test_refusals_on_a_link_never_up_become_hopeless_after_the_grace():
    link = feed(Link(ADDR, encrypted=False), refused(10.0))
    assert link.trouble == f"connection refused at {ADDR}: is a broker running there?"
    assert link.hopeless(10.0 + REFUSED_GRACE / 2) is None
    assert link.hopeless(10.0 + REFUSED_GRACE) == link.trouble


def test_a_link_that_was_up_waits_for_a_restarting_broker():
    link = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0), (DISCONNECTED, 7, 5.0),
                (RETRIED, 100, 5.0), refused(5.1), refused(60.0))
    assert not link.up and "connection refused" in (link.trouble or "")
    assert link.hopeless(600.0) is None
    assert link.silence("no reply within 30 s").startswith("no reply within 30 s: connection refused")
    feed(link, (CONNECTED, 8, 61.0), (SUCCEEDED, 0, 61.0))
    assert link.up and link.trouble is None and link.handshakes == 2


def test_a_retry_after_a_dropped_connection_is_not_a_refusal():
    link = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0), (DISCONNECTED, 7, 1.0),
                (RETRIED, 100, 1.0))
    assert link.trouble is None


def test_a_mechanism_mismatch_is_final_at_once_and_says_which_side_lacks_encryption():
    plain = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (PROTOCOL, MISMATCH, 0.0))
    assert plain.hopeless(0.0) == plain.trouble and f"the broker at {ADDR} is encrypted (CURVE)" in plain.trouble
    keyed = feed(Link(ADDR, encrypted=True), (CONNECTED, 7, 0.0), (PROTOCOL, MISMATCH, 0.0))
    assert f"the broker at {ADDR} is not encrypted" in (keyed.hopeless(0.0) or "")


def test_a_curve_handshake_failing_again_and_again_is_final():
    link = Link(ADDR, encrypted=True)
    for attempt in range(HANDSHAKE_FAILURES_FINAL):
        assert link.hopeless(0.1 * attempt) is None
        feed(link, (CONNECTED, 7, 0.1 * attempt), (NO_DETAIL, 32, 0.1 * attempt), (DISCONNECTED, 7, 0.1 * attempt),
             (RETRIED, 100, 0.1 * attempt))
        assert link.trouble.startswith(f"CURVE handshake with {ADDR} failed")
    assert link.hopeless(1.0) == link.trouble


def test_a_plain_broker_dropping_an_encrypting_peer_is_named_once_the_mismatch_shows():
    link = feed(Link(ADDR, encrypted=True), (CONNECTED, 7, 0.0), (NO_DETAIL, 32, 0.0), (RETRIED, 100, 0.0),
                (CONNECTED, 7, 0.1), (PROTOCOL, MISMATCH, 0.1))
    assert link.hopeless(0.1) == link.trouble and f"the broker at {ADDR} is not encrypted" in link.trouble


def test_silence_says_what_the_connection_was_doing():
    assert "no connection could be made" in Link(ADDR, encrypted=False).silence("no reply")
    half = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0))
    assert "handshake never completed" in half.silence("no reply")
    up = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0))
    assert "the connection is up" in up.silence("no reply")


def test_a_plain_peer_dropped_by_an_encrypted_broker_waits_for_the_mismatch_however_slow_the_events():
    link = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (NO_DETAIL, 32, 0.0), (RETRIED, 100, 0.0))
    assert "dropped the connection during the handshake" in link.trouble
    assert link.hopeless(30.0) is None, "not a refusal: no grace runs out"
    feed(link, (CONNECTED, 7, 30.0), (PROTOCOL, MISMATCH, 30.0))
    assert f"the broker at {ADDR} is encrypted (CURVE)" in (link.hopeless(30.0) or "")


def test_a_settled_trouble_is_kept_until_a_handshake_succeeds():
    link = feed(Link(ADDR, encrypted=False), (CONNECTED, 7, 0.0), (PROTOCOL, MISMATCH, 0.0))
    settled = link.trouble
    feed(link, (RETRIED, 100, 0.1), (CONNECTED, 7, 0.2), (NO_DETAIL, 32, 0.2))
    assert link.trouble == settled and link.final
    feed(link, (CONNECTED, 7, 1.0), (SUCCEEDED, 0, 1.0))
    assert link.trouble is None and not link.final


# --------------------------------------------------------------------- a primary and its standbys

PRIMARY, STANDBY = "tcp://127.0.0.1:5555", "tcp://127.0.0.1:6555"


def at(links: Links, endpoint: str, *events: tuple[int, int, float]) -> Links:
    for event, value, now in events:
        links.observe(int(event), int(value), endpoint.encode(), now)
    return links


def test_a_refusing_standby_is_no_trouble_while_the_primary_is_up():
    links = at(Links((PRIMARY, STANDBY), encrypted=False), PRIMARY, (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0))
    at(links, STANDBY, refused(0.0), refused(30.0))
    assert links.up and links.trouble is None and links.hopeless(60.0) is None


def test_after_the_primary_dies_the_links_wait_for_the_standby_and_carry_on_with_it():
    links = at(Links((PRIMARY, STANDBY), encrypted=False), PRIMARY, (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0))
    at(links, STANDBY, refused(0.0))
    at(links, PRIMARY, (DISCONNECTED, 7, 5.0), (RETRIED, 100, 5.0), refused(5.1))
    assert not links.up and links.hopeless(600.0) is None, "the primary was up: a takeover is awaited"
    assert "connection refused at tcp://127.0.0.1:5555" in (links.trouble or "")
    at(links, STANDBY, (CONNECTED, 9, 5.5), (SUCCEEDED, 0, 5.5))
    assert links.up and links.trouble is None and links.handshakes == 2


def test_links_never_up_are_hopeless_only_when_every_address_is():
    links = at(Links((PRIMARY, STANDBY), encrypted=False), PRIMARY, refused(0.0))
    assert links.trouble is None, "the standby's address has not failed yet"
    assert links.hopeless(10.0) is None
    at(links, STANDBY, refused(0.5))
    assert links.hopeless(0.5 + REFUSED_GRACE / 2) is None
    reason = links.hopeless(0.5 + REFUSED_GRACE)
    assert reason is not None and PRIMARY in reason and STANDBY in reason


def test_events_under_the_resolved_host_name_reach_the_link_of_that_address():
    links = Links(("tcp://localhost:5555", STANDBY), encrypted=False)
    at(links, "tcp://127.0.0.1:5555", (CONNECTED, 7, 0.0), (SUCCEEDED, 0, 0.0))
    assert links.links[0].up and not links.links[1].up


def test_addresses_come_as_a_list_or_with_commas_in_order_without_repeats():
    assert parse_addresses(f"{PRIMARY}, {STANDBY}", "broker address") == (PRIMARY, STANDBY)
    assert parse_addresses([PRIMARY, f"{STANDBY},{PRIMARY}"], "broker address") == (PRIMARY, STANDBY)
    for bad in ("", [], " , ", [PRIMARY, 5], b"tcp://x:1", 5):
        with pytest.raises(InvalidArgument, match="broker address"):
            parse_addresses(bad, "broker address")  # type: ignore[arg-type]
