"""The dashboard (and the metrics) against hostile peers, with raw HTTP on 127.0.0.1 against a real broker: a
foreign name (DNS rebinding), half-open connections that would lock the admins out (slowloris), and resets
mid-request."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request

import cronoq
from cronoq.broker.dashboard.http import MAX_GUESTS, MAX_GUESTS_PER_PEER
from tests.integration.test_dashboard import request, until
from tests.support import free_port

TOKENS = {"T_ADMIN": "admin-secret"}
TOKENS_TOML = '\n[[auth.tokens]]\ntoken_env = "T_ADMIN"\nrole = "admin"\n'


def paused(broker) -> bool:
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        return admin.stats()["pools"]["default"]["paused"]


def test_a_page_under_a_foreign_name_can_neither_read_nor_act(broker_factory):
    port = free_port()
    broker = broker_factory(broker_extra=f'dashboard = "127.0.0.1:{port}"\n'
                                         f'dashboard_hosts = ["cronoq.internal:{port}", "proxy.example"]')
    # DNS rebinding: the page's own name, pointed at 127.0.0.1, in Host and Origin, with the action header.
    foreign = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    status, _, body = request(port, "POST", "/api/pools/default/pause", act=True, headers=foreign)
    assert status == 421, body
    error = json.loads(body)["error"]
    assert error["code"] == "PERMISSION_DENIED" and "evil.example" in error["message"]
    assert "dashboard_hosts" in error["message"]
    assert not paused(broker)
    assert request(port, "GET", "/api/overview", headers={"Host": f"evil.example:{port}"})[0] == 421
    assert request(port, "GET", "/", headers={"Host": "evil.example"})[0] == 421
    # A configured name with another port is not that name.
    assert request(port, "GET", "/api/overview", headers={"Host": "cronoq.internal:1"})[0] == 421
    # The right Host, but an action from a foreign page (Origin): refused too.
    status, _, body = request(port, "POST", "/api/pools/default/pause", act=True,
                              headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in json.loads(body)["error"]["message"]
    assert request(port, "POST", "/api/pools/default/pause", act=True, headers={"Origin": "null"})[0] == 403
    assert not paused(broker)
    # The names it answers to: its addresses, localhost (a tunnel's port too), and the configured ones.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost:8000", f"[::1]:{port}",
                 f"cronoq.internal:{port}", "proxy.example", "proxy.example:443"):
        assert request(port, "GET", "/api/session", headers={"Host": host})[0] == 200, host
    status, _, _ = request(port, "POST", "/api/pools/default/pause", act=True,
                           headers={"Host": "proxy.example", "Origin": "https://proxy.example"})
    assert status == 200 and paused(broker)
    status, _, _ = request(port, "POST", "/api/pools/default/resume", act=True,
                           headers={"Origin": f"http://127.0.0.1:{port}"})
    assert status == 200 and not paused(broker)


def half_open(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection that sends the start of a request head and no more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def test_half_open_connections_do_not_lock_the_admins_out(broker_factory):
    port = free_port()
    broker_factory(TOKENS_TOML, env=TOKENS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    # The admin's browser has a connection open already (kept alive between polls).
    kept = socket.create_connection(("127.0.0.1", port), timeout=30)
    ask = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer admin-secret\r\n\r\n"
    kept.sendall(ask)
    assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
    # One peer opens three times the guests' room in half-open connections, from 127.0.0.1 and from
    # 127.0.0.2-9 (one host has many loopback addresses), and keeps them trickling.
    sources = [f"127.0.0.{n}" for n in range(1, 10)]
    attackers = [half_open(port, sources[n % len(sources)]) for n in range(3 * MAX_GUESTS)]
    try:
        served = 0
        for _ in range(12):
            for sock in attackers:
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass  # closed to make room: as intended
            # A new admin connection (a browser opening one more) and the kept one are both served.
            status, _, _ = request(port, "GET", "/api/overview", "admin-secret")
            kept.sendall(ask)
            reply = kept.recv(65536)
            served += (status == 200) + reply.startswith(b"HTTP/1.1 200 ")
        assert served == 24, f"{served} of 24 admin requests served among half-open connections"
    finally:
        for sock in attackers:
            sock.close()
        kept.close()


def test_one_peers_connections_push_out_only_its_own(broker_factory):
    port = free_port()
    broker_factory(broker_extra=f'dashboard = "127.0.0.1:{port}"')
    greedy = [half_open(port) for _ in range(10 * MAX_GUESTS_PER_PEER)]
    other = half_open(port, "127.0.0.2")  # another peer's request, slow but still arriving
    try:
        other.sendall(b"1\r\n\r\n")
        assert other.recv(65536).startswith(b"HTTP/1.1 200 ")
        # The first of the greedy peer's were closed to make room for its later ones.
        greedy[0].settimeout(10)
        try:
            assert greedy[0].recv(100) == b""
        except ConnectionResetError:
            pass
    finally:
        other.close()
        for sock in greedy:
            sock.close()


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
              or line.startswith(name + "{")]
    return sum(values)


def test_a_page_under_a_foreign_name_cannot_read_the_metrics(broker_factory):
    port = free_port()
    broker_factory(broker_extra=f'metrics = "127.0.0.1:{port}"')
    # DNS rebinding: the page's own name, pointed at 127.0.0.1, in Host (a browser without Fetch Metadata).
    status, _, body = request(port, "GET", "/metrics", headers={"Host": f"evil.example:{port}"})
    assert status == 421 and b"evil.example" in body and b"cronoq_" not in body, body
    # A current browser's script under any name says it is the page's own origin.
    status, _, body = request(port, "GET", "/metrics", headers={"Host": f"127.0.0.1:{port}",
                                                                "Sec-Fetch-Site": "same-origin"})
    assert status == 403 and b"Sec-Fetch-Site" in body and b"cronoq_" not in body, body
    # Scrapers, curl and a person's browser (an address typed: `none`) read them.
    for headers in ({"Host": f"127.0.0.1:{port}"}, {"Host": f"localhost:{port}"}, {"Host": f"[::1]:{port}"},
                    {"Host": f"localhost:{port}", "Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}):
        status, _, body = request(port, "GET", "/metrics", headers=headers)
        assert status == 200 and b"cronoq_workers_connected" in body, (headers, body[:200])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # HTTP/1.0, no Host at all
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 200") and b"cronoq_workers_connected" in answer, answer[:200]


def test_the_metrics_answer_to_the_names_in_metrics_hosts_and_a_reload_changes_them(broker_factory):
    port = free_port()
    broker = broker_factory(TOKENS_TOML, env=TOKENS,
                            broker_extra=f'metrics = "127.0.0.1:{port}"\nmetrics_hosts = ["prom-target:{port}"]')
    assert request(port, "GET", "/metrics", headers={"Host": f"prom-target:{port}"})[0] == 200
    assert request(port, "GET", "/metrics", headers={"Host": f"localhost:{port}"})[0] == 200
    status, _, body = request(port, "GET", "/metrics", headers={"Host": f"other-target:{port}"})
    assert status == 421 and b"metrics_hosts" in body and b"cronoq_" not in body, body
    text = broker.config_path.read_text()
    broker.config_path.write_text(text.replace(f'["prom-target:{port}"]', f'["other-target:{port}"]'))
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        assert admin.reload()["needs_restart"] == []
    assert request(port, "GET", "/metrics", headers={"Host": f"other-target:{port}"})[0] == 200
    assert request(port, "GET", "/metrics", headers={"Host": f"prom-target:{port}"})[0] == 421


def test_connections_reset_mid_request_are_counted_not_logged(broker_factory):
    port, metrics_port = free_port(), free_port()
    broker = broker_factory(broker_extra=f'dashboard = "127.0.0.1:{port}"\nmetrics = "127.0.0.1:{metrics_port}"')
    resets = 200
    for _ in range(resets):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        time.sleep(0.002)  # let the server read the half it was sent
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, not a close
    until(lambda: metric(metrics_port, "cronoq_dashboard_connections_reset_total") >= resets * 0.9,
          "the resets are counted")
    assert request(port, "GET", "/api/session")[0] == 200
    broker.stop()
    log = broker.log.read_text()
    assert "Traceback" not in log and "ValueError" not in log, log[-3000:]
