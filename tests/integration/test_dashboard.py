"""The dashboard's JSON API and its HTTP server, against the real broker with a real worker process.

What a browser shows is in test_dashboard_browser.py; here: the documented endpoints and their fields, who may
use them, and the bounds that keep a browser (or anything else that speaks to the port) from costing the broker.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

import cronoq
from cronoq.broker.dashboard.http import HEAD_TIMEOUT, MAX_GUESTS_PER_PEER, MAX_HEADERS
from cronoq.client.text import status_text
from tests.support import ROOT, free_port, run_command, start_worker_process

POOLS = '[[pools]]\nname = "llm"\n[pools.tenant_weights]\nacme = 3\nglobex = 1\n\n[[pools]]\nname = "failing"\n'
TOKENS = {"T_ADMIN": "admin-secret", "T_VIEWER": "viewer-secret", "T_CLIENT": "client-secret"}
TOKENS_TOML = "".join(f'\n[[auth.tokens]]\ntoken_env = "{env}"\nrole = "{role}"\n'
                      for env, role in (("T_ADMIN", "admin"), ("T_VIEWER", "viewer"), ("T_CLIENT", "client")))


def request(port: int, method: str, path: str, token: str | None = None, *, act: bool = False,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if act:
            sent["X-Cronoq-Dashboard"] = "1"
        conn.request(method, path, headers=sent)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def get_json(port: int, path: str, token: str | None = None) -> dict:
    status, _, body = request(port, "GET", path, token)
    assert status == 200, body
    return json.loads(body)


def until(condition, what: str, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting until {what}")


@pytest.fixture
def worker_factory(tmp_path):
    started = []

    def start(broker, env=None):
        proc = start_worker_process(broker.workers, "tests.apps.dashboard:pools", tmp_path / f"w{len(started)}.log",
                                    concurrency=2, env=env, cwd=ROOT)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def test_the_overview_shows_pools_tenants_workers_and_failures(broker_factory, worker_factory):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    worker_factory(broker)
    with cronoq.connect_sync(broker.clients) as client:
        client.pause("llm")
        for i in range(200):
            client.submit(i, pool="llm", tenant="acme")
            client.submit(i, pool="llm", tenant="globex")
        failed = client.submit("not a prompt", pool="failing", tenant="acme")
        with pytest.raises(cronoq.TaskFailed):
            failed.result(timeout=30)
    overview = until(lambda: (o := get_json(port, "/api/overview"))["failures"] and o, "the failure is listed")
    pools = {pool["name"]: pool for pool in overview["pools"]}
    llm = pools["llm"]
    assert llm["paused"] and llm["fair"] and llm["queued"] == 400 and llm["workers"] == 1
    tenants = {row["tenant"]: row for row in llm["tenants"]}
    assert tenants["acme"]["weight"] == 3.0 and tenants["acme"]["queued"] == 200
    assert tenants["acme"]["weighted_share"] == pytest.approx(0.75)
    assert tenants["globex"]["weighted_share"] == pytest.approx(0.25)
    assert overview["workers_connected"] == 1
    (worker,) = overview["workers"]
    assert worker["pools"] == ["llm", "failing"] and worker["concurrency"] == 2 and worker["last_seen"] < 30
    (failure,) = overview["failures"]
    assert failure["id"] == failed.id and failure["error_type"] == "ValueError" and failure["tenant"] == "acme"
    assert "not a prompt" in failure["message"] and "traceback" not in failure
    detail = get_json(port, f"/api/failures/{failed.id}")
    assert "in _check" in detail["traceback"]
    task = get_json(port, f"/api/tasks/{failed.id}")
    assert task["state"] == "failed" and task["attempts"] == 1 and task["pool"] == "failing"
    assert task["error"].startswith("ValueError") and "in _check" in task["traceback"]
    status, _, body = request(port, "GET", "/api/tasks/no-such-task")
    assert status == 404 and json.loads(body)["error"]["code"] == "NOT_FOUND"

    # Resumed, the pool runs its backlog and the shares follow the weights while both tenants have work.
    status, _, _ = request(port, "POST", "/api/pools/llm/resume", act=True)
    assert status == 200

    def busy_llm():
        llm = {pool["name"]: pool for pool in get_json(port, "/api/overview")["pools"]}["llm"]
        return llm["dispatched"] >= 40 and llm

    llm = until(busy_llm, "the resumed pool dispatched")
    assert not llm["paused"]
    tenants = {row["tenant"]: row for row in llm["tenants"]}
    assert tenants["globex"]["queued"] > 0  # both still backlogged: acme got about 3 for each of globex's
    assert tenants["acme"]["recent_dispatches"] >= 2 * tenants["globex"]["recent_dispatches"]


def test_viewers_share_one_snapshot_a_second(broker_factory):
    port = free_port()
    broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    started = time.monotonic()
    stamps = [get_json(port, "/api/overview")["now"] for _ in range(30)]
    elapsed = time.monotonic() - started
    # However many requests, at most one snapshot per second (plus the one being served as the second turns).
    assert len(set(stamps)) <= int(elapsed) + 2


def test_tokens_are_asked_for_and_roles_apply(broker_factory):
    port = free_port()
    broker = broker_factory(POOLS + TOKENS_TOML, env=TOKENS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    status, headers, _ = request(port, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")  # the page holds no data
    status, headers, body = request(port, "GET", "/api/overview")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert json.loads(body)["error"]["code"] == "UNAUTHENTICATED"
    # Said for someone with a browser or curl, not for a program calling cronoq.connect.
    message = json.loads(body)["error"]["message"]
    assert "cronoq.connect" not in message and "Authorization: Bearer" in message and "page" in message
    assert request(port, "GET", "/api/overview", "wrong-secret")[0] == 401
    assert request(port, "GET", "/api/overview", headers={"Authorization": "Basic YWRtaW4="})[0] == 401
    status, _, body = request(port, "GET", "/api/overview", "client-secret")
    assert status == 403 and "viewer or admin" in json.loads(body)["error"]["message"]
    assert get_json(port, "/api/session", "viewer-secret") == {"role": "viewer", "auth": True, "may_act": False,
                                                               "interval": 1.0, "tenant": None}
    assert get_json(port, "/api/overview", "viewer-secret")["pools"]
    status, _, body = request(port, "POST", "/api/pools/llm/pause", "viewer-secret", act=True)
    assert status == 403 and "a viewer token may not pause a pool" in json.loads(body)["error"]["message"]
    status, _, body = request(port, "POST", "/api/pools/llm/pause", "admin-secret")  # no action header
    assert status == 403 and "X-Cronoq-Dashboard" in json.loads(body)["error"]["message"].replace(
        "x-cronoq-dashboard", "X-Cronoq-Dashboard")
    assert request(port, "POST", "/api/pools/nope/pause", "admin-secret", act=True)[0] == 404
    assert request(port, "POST", "/api/pools/llm/pause", "admin-secret", act=True)[0] == 200
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        assert admin.stats()["pools"]["llm"]["paused"]  # committed before the answer came
        task = admin.submit(1, pool="llm")
    status, _, body = request(port, "POST", f"/api/tasks/{task.id}/cancel", "viewer-secret", act=True)
    assert status == 403
    status, _, body = request(port, "POST", f"/api/tasks/{task.id}/cancel", "admin-secret", act=True)
    assert status == 200 and json.loads(body) == {"id": task.id, "cancelled": True}
    assert get_json(port, f"/api/tasks/{task.id}", "viewer-secret")["state"] == "cancelled"


def test_a_viewer_token_on_the_client_socket_reads_and_changes_nothing(broker_factory):
    broker = broker_factory(POOLS + TOKENS_TOML, env=TOKENS)
    with cronoq.connect_sync(broker.clients, token="client-secret") as client:
        task = client.submit(1, pool="llm", tenant="acme")
    with cronoq.connect_sync(broker.clients, token="viewer-secret") as viewer:
        assert "llm" in viewer.stats()["pools"]
        assert viewer.status(task.id).state == "queued"
        assert viewer.explain(task.id).state == "queued"  # why it waits: read-only, as status is
        for attempt in (lambda: viewer.submit(1, pool="llm"), lambda: viewer.cancel(task.id),
                        lambda: viewer.pause("llm"), lambda: viewer.result(task.id, timeout=5)):
            with pytest.raises(cronoq.PermissionDenied, match="a viewer token may not"):
                attempt()


def raw_exchange(port: int, data: bytes, timeout: float = 20.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_oversized_or_malformed_requests_are_refused_and_closed(broker_factory):
    port = free_port()
    broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    huge_header = b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    assert raw_exchange(port, huge_header).startswith(b"HTTP/1.1 431 ")
    many = b"".join(b"X-H%d: 1\r\n" % n for n in range(MAX_HEADERS + 1))
    assert raw_exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
    big_body = b"POST /api/pools/llm/pause HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    assert raw_exchange(port, big_body).startswith(b"HTTP/1.1 413 ")
    assert raw_exchange(port, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    status, headers, _ = request(port, "DELETE", "/api/overview")
    assert status == 405 and "GET" in headers["allow"]
    assert request(port, "GET", "/etc/passwd")[0] == 404
    assert request(port, "GET", "/api/nothing-here")[0] == 404


def test_stalled_and_surplus_connections_cost_the_broker_nothing(broker_factory):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    # A half-sent request holds its connection only until HEAD_TIMEOUT (from another loopback address: the
    # idle ones below would push it out first otherwise).
    stalled = socket.create_connection(("127.0.0.1", port), timeout=HEAD_TIMEOUT + 20,
                                       source_address=("127.0.0.2", 0))
    stalled.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n")
    # A peer that asks and asks and never reads is dropped once the socket's buffers are full.
    greedy = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.3", 0))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # Surplus idle connections of one peer push out its oldest: a new request is still answered.
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2 * MAX_GUESTS_PER_PEER)]
    answer = raw_exchange(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    for sock in idle:
        sock.close()
    try:
        pipelined = b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n" * 2000
        dropped = False
        try:
            for _ in range(200):
                greedy.sendall(pipelined)
                # Meanwhile the broker answers its clients and other browsers.
                with cronoq.connect_sync(broker.clients) as client:
                    assert "llm" in client.stats()["pools"]
                until(lambda: request(port, "GET", "/api/session")[0] == 200, "another browser is served")
        except (ConnectionResetError, BrokenPipeError):
            dropped = True
        assert dropped, "a peer that never reads was never dropped"
        try:
            assert stalled.recv(65536) == b"", "a half-sent request was answered"
        except ConnectionResetError:
            pass  # dropped with a reset: what the server does to a peer past its time

    finally:
        stalled.close()
        greedy.close()


def test_a_reload_keeps_the_dashboard_where_it_is(broker_factory):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    text = broker.config_path.read_text()
    broker.config_path.write_text(text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}"))
    with cronoq.connect_sync(broker.clients) as admin:
        assert admin.reload()["needs_restart"] == ["dashboard"]
    assert get_json(port, "/api/session")["role"] == "admin"


def test_a_dashboard_address_in_use_stops_the_broker_before_it_starts(broker_factory, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = tmp_path / "busy.toml"
        config.write_text(f'[broker]\nclients = "tcp://127.0.0.1:{free_port()}"\nworkers = "tcp://127.0.0.1:{free_port()}"\n'
                          f'dashboard = "127.0.0.1:{port}"\ndata_dir = "busy-data"\n')
        result = run_command(["-m", "cronoq.broker.cli", "-c", str(config)], timeout=30)
    assert result.returncode == 1
    assert f"cannot serve the dashboard at 127.0.0.1:{port}" in result.stderr
    assert not (tmp_path / "busy-data").exists()  # nothing touched


PINNED_POOLS = ('[[pools]]\nname = "llm"\n[pools.tenant_weights]\nacme = 3\nglobex = 1\n"acme/search" = 2\n\n'
                '[[pools]]\nname = "failing"\n')
PINNED = {"T_ADMIN": "admin-secret", "T_ACME_VIEWER": "acme-viewer", "T_ACME_ADMIN": "acme-admin",
          "T_SEARCH_VIEWER": "search-viewer", "T_WORKER": "worker-secret"}
PINNED_TOML = "".join(f'\n[[auth.tokens]]\ntoken_env = "{env}"\nrole = "{role}"\n'
                      + (f'tenant = "{tenant}"\n' if tenant else "")
                      for env, role, tenant in (("T_ADMIN", "admin", None), ("T_ACME_VIEWER", "viewer", "acme"),
                                                ("T_ACME_ADMIN", "admin", "acme"),
                                                ("T_SEARCH_VIEWER", "viewer", "acme/search"), ("T_WORKER", "worker", None)))


def test_a_token_pinned_to_a_tenant_sees_its_subtree_only(broker_factory, worker_factory):
    port = free_port()
    broker = broker_factory(PINNED_POOLS + PINNED_TOML, env=PINNED, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    worker_factory(broker, env={**PINNED, "CRONOQ_TOKEN": "worker-secret"})
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        admin.pause("llm")
        for i in range(5):
            admin.submit(i, pool="llm", tenant="acme/search")
        for i in range(7):
            other = admin.submit(i, pool="llm", tenant="globex", priority="high", deadline=3600)
        failures = [admin.submit("x", pool="failing", tenant=tenant) for tenant in ("acme", "globex")]
        for failed in failures:
            with pytest.raises(cronoq.TaskFailed):
                failed.result(timeout=30)
    until(lambda: len(get_json(port, "/api/overview", "admin-secret")["failures"]) == 2, "both failures are listed")

    for token in ("acme-viewer", "acme-admin"):
        assert get_json(port, "/api/session", token)["tenant"] == "acme"
        overview = get_json(port, "/api/overview", token)
        llm = {pool["name"]: pool for pool in overview["pools"]}["llm"]
        assert [row["tenant"] for row in llm["tenants"]] == ["acme", "acme/search"]
        assert [row["depth"] for row in llm["tenants"]] == [0, 1]
        assert llm["queued"] == 5 and llm["tenant_count"] == 1  # globex and its 7 tasks are not counted
        assert llm["tenants"][0]["weighted_share"] == pytest.approx(1.0) and llm["tenants"][0]["lag"] == 0.0
        assert [f["tenant"] for f in overview["failures"]] == ["acme"]
        assert all(w["busy"] is None for w in overview["workers"])  # busy slots would count others' tasks
        assert "globex" not in json.dumps(overview)
        status, _, body = request(port, "GET", f"/api/tasks/{other.id}", token)
        assert status == 404 and json.loads(body)["error"]["code"] == "NOT_FOUND"
        assert request(port, "GET", f"/api/failures/{failures[1].id}", token)[0] == 404
        assert "globex" not in json.dumps(get_json(port, "/api/history", token))
        with cronoq.connect_sync(broker.clients, token=token) as pinned:
            stats = pinned.stats()
        pool = stats["pools"]["llm"]
        assert set(pool["tenants"]) == {"acme/search"} and pool["queued"] == 5 and pool["tenant_count"] == 1
        assert pool["classes"] == {} and "dispatch_rate" not in pool and "ready_workers" not in pool
        assert stats["memory"] == {} and stats["store"] == {} and "globex" not in json.dumps(stats)
        text = status_text(stats)  # what `cronoq status` prints for it: no rate or class counts it was not given
        assert "pinned to acme" in text and "/s over" not in text and "queued by class: not shown" in text

    # Pinned below the top level, the shares over time follow its own node: from the sample 5 s after the first on.
    def search_points():
        return get_json(port, "/api/history/llm", "search-viewer")["pools"]["llm"]["points"]

    points = until(search_points, "a point of acme/search's chart", timeout=30)
    assert all(set(point["tenants"]) == {"acme/search"} for point in points)
    assert points[-1]["rate"] == 0.0 and "globex" not in json.dumps(points)  # its pool is paused: nothing dispatched

    # Unpinned, everything as before.
    overview = get_json(port, "/api/overview", "admin-secret")
    llm = {pool["name"]: pool for pool in overview["pools"]}["llm"]
    assert {row["tenant"] for row in llm["tenants"]} == {"acme", "acme/search", "globex"} and llm["queued"] == 12
    assert get_json(port, f"/api/tasks/{other.id}", "admin-secret")["tenant"] == "globex"
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        assert admin.stats()["pools"]["llm"]["classes"]["high"]["queued"] == 7


@pytest.mark.long_running  # about 20-30 s: started first, so the run does not end waiting for it
def test_the_shares_over_time_follow_a_3_to_1_pool(broker_factory, worker_factory):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    worker_factory(broker)
    with cronoq.connect_sync(broker.clients) as client:
        client.pause("llm")
        for i in range(900):
            client.submit(i, pool="llm", tenant="acme")
        for i in range(300):
            client.submit(i, pool="llm", tenant="globex")
        client.resume("llm")

    def measured():
        points = get_json(port, "/api/history/llm")["pools"]["llm"]["points"]
        full = [p for p in points if p["dispatches"] >= 40 and p["tenants"].get("acme", {}).get("share") is not None
                and p["tenants"].get("globex", {}).get("share") is not None]
        return len(full) >= 2 and (points, full)

    points, full = until(measured, "two points of the history measure both tenants", timeout=90)
    for point in full:
        acme, globex = point["tenants"]["acme"], point["tenants"]["globex"]
        assert acme["weighted_share"] == pytest.approx(0.75) and globex["weighted_share"] == pytest.approx(0.25)
        assert acme["share"] == pytest.approx(0.75, abs=0.1) and acme["share"] + globex["share"] == pytest.approx(1.0)
        assert point["rate"] > 0
    assert [p["at"] for p in points] == sorted(p["at"] for p in points)
    everything = get_json(port, "/api/history")
    assert set(everything["pools"]) == {"llm", "failing"} and everything["interval"] == 5.0
    status, _, body = request(port, "GET", "/api/history/nope")
    assert status == 404 and "no pool named 'nope'" in json.loads(body)["error"]["message"]
