"""The dashboard's routes over a real task book and core, in memory: requests in, responses out, no sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import time

import msgspec
import pytest

from cronoq.book.submission import SubmitRequest

from cronoq.answers import explain_text
from cronoq.book.taskbook import TaskBook
from cronoq.broker.auth import Authenticator
from cronoq.broker.config import TokenSpec
from cronoq.broker.dashboard import BrokerParts, Dashboard
from cronoq.broker.dashboard.http import Request, Response
from cronoq.broker.failures import RecentFailures
from cronoq.core import FAILED, PoolSettings, SchedulerCore, Task
from tests.support import LoopTurns

TOKENS = (TokenSpec(b"admin-secret", "admin", None, "T_ADMIN"), TokenSpec(b"viewer-secret", "viewer", None, "T_VIEWER"),
          TokenSpec(b"acme-admin", "admin", "acme", "T_ACME"), TokenSpec(b"globex-viewer", "viewer", "globex", "T_GLOBEX"),
          TokenSpec(b"search-viewer", "viewer", "acme/search", "T_SEARCH"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def broker_parts(explain=None, pools=None) -> tuple[BrokerParts, TaskBook, Clock]:
    """A book and core as the broker keeps them (of `pools`; by default one, llm), and the parts the dashboard
    reads of them."""
    clock = Clock()
    pools = pools or [PoolSettings("llm", {"acme": 3})]
    core = SchedulerCore(pools)
    failures = RecentFailures()
    ids = (f"task{n}" for n in itertools.count())

    def on_terminal(record):
        if record.state == FAILED:
            failures.add(record.id, record.pool, record.tenant, record.error_type, record.error_message,
                         record.traceback, record.attempts, record.finished_at)

    book = TaskBook(core, new_id=ids.__next__, on_terminal=on_terminal, rng=random.Random(0),
                    pacing_clock=time.perf_counter)
    auth = Authenticator(TOKENS)
    parts = BrokerParts(
        stats=lambda: {"pools": core.stats(), "workers": 0}, identify=auth.identify, pools=lambda: pools,
        core=core, book=book, workers=lambda: [], failures=failures, act=lambda action: action(clock()),
        clock=clock, explain=explain, pinned_tenants=lambda: {t.tenant for t in TOKENS if t.tenant is not None},
    )
    return parts, book, clock


def fail(book: TaskBook, tenant: str, now: float) -> str:
    record, _ = book.submit(SubmitRequest(b"\xc0", pool="llm", tenant=tenant), now)
    book.core.add_worker("w", ["llm"], 1)
    book.dispatch(now)
    book.complete("w", record.id, 1, now, ok=False, error_type="ValueError", error_message="no",
                  traceback="Traceback...\nValueError: no")
    book.core.remove_worker("w", now)
    return record.id


def get(dashboard: Dashboard, path: str, token: str | None = "admin-secret", method: str = "GET",
        act: bool = True) -> tuple[int, dict]:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    if act and method == "POST":
        headers["x-cronoq-dashboard"] = "1"
    response = dashboard.handle(Request(method, path, headers))
    return response.status, json.loads(response.body) if response.content_type == "application/json" else {}


def test_the_task_view_carries_the_brokers_explanation_as_data_and_as_cronoq_explain_prints_it():
    parts, book, clock = broker_parts()
    parts = dataclasses.replace(parts, explain=lambda task_id, scope=None: msgspec.to_builtins(
        book.explain(task_id, clock(), scope=scope)))
    book.core.pause("llm")
    record, _ = book.submit(SubmitRequest(b"\xc0", pool="llm", tenant="globex", cost=4.5), clock())
    status, view = get(Dashboard(parts), f"/api/tasks/{record.id}")
    assert status == 200 and view["state"] == "queued" and view["attempts"] == 0 and view["cost"] == 4.5
    assert view["explain"]["waiting"]["paused"] is True
    assert view["explain_text"] == explain_text(book.explain(record.id, clock()))
    assert "paused" in view["explain_text"]
    parts, book, clock = broker_parts()
    record, _ = book.submit(SubmitRequest(b"\xc0", pool="llm", tenant="globex"), clock())
    assert "explain" not in get(Dashboard(parts), f"/api/tasks/{record.id}")[1]


def test_the_task_view_explains_to_a_pinned_token_what_explain_would_tell_it():
    parts, book, clock = broker_parts()
    parts = dataclasses.replace(parts, explain=lambda task_id, scope=None: msgspec.to_builtins(
        book.explain(task_id, clock(), scope=scope)))
    book.core.pause("llm")
    for _ in range(3):
        book.submit(SubmitRequest(b"\xc0", pool="llm", tenant="globex", priority="critical"), clock())
    record, _ = book.submit(SubmitRequest(b"\xc0", pool="llm", tenant="acme"), clock())
    pinned = get(Dashboard(parts), f"/api/tasks/{record.id}", "acme-admin")[1]
    assert pinned["explain"]["waiting"]["scope"] == "acme"
    assert pinned["explain"]["waiting"]["higher_classes_ahead"] == 0  # globex's three are not told
    assert "globex" not in json.dumps(pinned)
    unpinned = get(Dashboard(parts), f"/api/tasks/{record.id}")[1]
    assert unpinned["explain"]["waiting"]["higher_classes_ahead"] == 3


def test_a_token_pinned_to_a_tenant_sees_only_its_own_failures_and_tasks():
    parts, book, clock = broker_parts()
    mine, theirs = fail(book, "acme/search", clock()), fail(book, "globex", clock())
    dashboard = Dashboard(parts)
    assert [f["id"] for f in get(dashboard, "/api/overview")[1]["failures"]] == [theirs, mine]
    assert [f["id"] for f in get(dashboard, "/api/overview", "acme-admin")[1]["failures"]] == [mine]
    status, answer = get(dashboard, f"/api/failures/{theirs}", "acme-admin")
    assert status == 404 and answer["error"]["code"] == "NOT_FOUND"
    assert get(dashboard, f"/api/tasks/{theirs}", "acme-admin")[0] == 404
    assert get(dashboard, f"/api/failures/{mine}", "acme-admin")[1]["traceback"].endswith("ValueError: no")


def test_the_snapshot_is_rebuilt_once_a_second_and_after_an_action():
    parts, book, clock = broker_parts()
    ticks = iter([0.0, 0.5, 0.9, 1.2, 1.3, 1.4])
    dashboard = Dashboard(parts, monotonic=lambda: next(ticks))
    stamps = []
    for _ in range(3):
        clock.now += 1
        stamps.append(get(dashboard, "/api/overview")[1]["now"])
    assert stamps == [1001.0, 1001.0, 1001.0]  # 0.0, 0.5, 0.9: the same snapshot
    clock.now += 1
    assert get(dashboard, "/api/overview")[1]["now"] == 1004.0  # 1.2: a new one
    assert get(dashboard, "/api/pools/llm/pause", method="POST")[0] == 200
    overview = get(dashboard, "/api/overview")[1]  # 1.4, but the pause made the snapshot stale
    assert overview["pools"][0]["paused"] is True


@pytest.mark.parametrize("path", ["/api/tasks/" + "x" * 201, "/api/tasks/a\x00b"])
def test_odd_task_ids_are_refused_plainly(path):
    status, answer = get(Dashboard(broker_parts()[0]), path)
    assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT"


def test_static_files_are_served_and_nothing_else():
    dashboard = Dashboard(broker_parts()[0])
    page = dashboard.handle(Request("GET", "/", {}))
    assert page.status == 200 and b"/static/app.js" in page.body
    script = dashboard.handle(Request("GET", "/static/app.js", {}))
    assert script.status == 200 and script.content_type.startswith("text/javascript")
    # Nothing fetched from elsewhere (the SVG namespace is a name, never fetched).
    assert b"http://" not in script.body.replace(b'"http://www.w3.org/2000/svg"', b"") and b"https://" not in page.body
    assert dashboard.handle(Request("GET", "/static/../app.py", {})).status == 404
    assert dashboard.handle(Request("POST", "/", {})).status == 405


async def test_on_the_loop_the_overview_is_built_a_pool_per_turn_and_a_stale_one_served_meanwhile():
    pools = [PoolSettings("llm", {"acme": 3}), PoolSettings("batch"), PoolSettings("etl")]
    parts, book, clock = broker_parts(pools=pools)
    core = book.core
    moments = iter([0.0, 1.5, 1.6, 1.7, 1.8])
    dashboard = Dashboard(parts, monotonic=lambda: next(moments))

    async def overview(token: str = "admin-secret") -> tuple[dict, int]:
        """The overview, and the turns the loop took while it waited for it (0: answered at once)."""
        answer = dashboard.handle(Request("GET", "/api/overview", {"authorization": f"Bearer {token}"}))
        with LoopTurns() as loop:
            if not isinstance(answer, Response):  # being built: this request waits for it
                answer = await answer
        return json.loads(answer.body), loop.turns

    first, turns = await overview()  # the first: the request waits while it is built
    assert first["now"] == 1000.0 and turns >= len(pools) - 1  # a pool a turn: the loop served others between
    clock.now = 1002.0
    core.submit(Task("t1", "batch", tenant="globex"), clock())
    # 1.5 s on: the snapshot is stale. This request still gets it at once; the next one is begun behind it.
    stale, turns = await overview()
    assert stale["now"] == 1000.0 and turns == 0
    with LoopTurns() as loop:
        while dashboard._rebuilding is not None and not dashboard._rebuilding.done():
            await asyncio.sleep(0)
    assert loop.turns >= len(pools) - 1
    fresh, _ = await overview()
    assert fresh["now"] == 1002.0 and [p["queued"] for p in fresh["pools"] if p["name"] == "batch"] == [1]
    # After an admin's action the next request waits for a snapshot that shows it.
    assert get(dashboard, "/api/pools/batch/pause", method="POST")[0] == 200
    assert [p["paused"] for p in (await overview())[0]["pools"] if p["name"] == "batch"] == [True]
    # A token pinned to a tenant that waits for a snapshot gets its own view of it: its subtree, none of globex.
    assert get(dashboard, "/api/pools/batch/resume", method="POST")[0] == 200
    pinned, turns = await overview("acme-admin")
    assert turns >= len(pools) - 1 and "globex" not in json.dumps(pinned)
    assert [p["queued"] for p in pinned["pools"] if p["name"] == "batch"] == [0]  # globex's task is not counted
    dashboard.close()


async def test_all_pools_shares_over_time_are_made_a_pool_per_turn_once_per_sample():
    pools = [PoolSettings("llm", {"acme": 3}), PoolSettings("batch"), PoolSettings("etl")]
    parts, book, clock = broker_parts(pools=pools)
    core = book.core
    dashboard = Dashboard(parts)
    for _ in range(3):
        await dashboard._sample()
        clock.now += 5
    request = Request("GET", "/api/history", {"authorization": "Bearer admin-secret"})
    pending = dashboard.handle(request)
    assert not isinstance(pending, Response)  # made over turns of the loop
    with LoopTurns() as loop:
        first = await pending
    assert loop.turns >= len(pools) - 1 and first.status == 200 and first.authenticated
    assert sorted(json.loads(first.body)["pools"]) == ["batch", "etl", "llm"]
    again = dashboard.handle(request)  # the same sample: the answer made already, at once
    assert isinstance(again, Response) and again.body == first.body
    await dashboard._sample()
    anew = dashboard.handle(request)
    assert not isinstance(anew, Response)  # a new sample: made anew
    assert (await anew).body != first.body
    # A pinned token's answer is its own, and tells nothing of the other tenants.
    pinned = await dashboard.handle(Request("GET", "/api/history", {"authorization": "Bearer acme-admin"}))
    assert pinned.body != first.body and b"globex" not in pinned.body
    dashboard.close()


def run(book: TaskBook, tenant: str, tasks: int, now: float) -> None:
    """`tasks` tasks of `tenant` submitted, dispatched and succeeded at `now`."""
    book.core.add_worker("w", ["llm"], tasks)
    records = [book.submit(SubmitRequest(b"\xc0", pool="llm", tenant=tenant), now)[0] for _ in range(tasks)]
    book.dispatch(now)
    for record in records:
        book.complete("w", record.id, 1, now, ok=True)
    book.core.remove_worker("w", now)


async def test_a_token_pinned_below_the_top_level_sees_its_own_dispatch_rate_over_time():
    parts, book, clock = broker_parts()
    dashboard = Dashboard(parts)
    for _ in range(3):
        run(book, "acme/search/alice", 10, clock())
        run(book, "acme/ads", 30, clock())
        run(book, "globex", 60, clock())
        await dashboard._sample()
        clock.now += 5
    status, search = get(dashboard, "/api/history/llm", "search-viewer")
    points = search["pools"]["llm"]["points"]
    assert status == 200 and len(points) == 2
    for point in points:  # (nothing of it queued at the samples: no share was promised to it then)
        assert point["tenants"] == {"acme/search": {"share": 1.0, "weighted_share": 0.0}}
    assert points[-1]["dispatches"] == 20 and points[-1]["rate"] == 2.0  # alice's 10 a sample, over 10 s
    assert "ads" not in json.dumps(search) and "globex" not in json.dumps(search)
    # The same token's chart of every pool, made a pool per turn, says the same.
    everything = await dashboard.handle(Request("GET", "/api/history", {"authorization": "Bearer search-viewer"}))
    assert json.loads(everything.body)["pools"]["llm"]["points"] == points
    # The admin's chart still has the top-level lines.
    _, admin = get(dashboard, "/api/history/llm")
    assert set(admin["pools"]["llm"]["points"][-1]["tenants"]) == {"acme", "globex"}
    dashboard.close()


def test_each_pinned_tenant_gets_its_own_view_of_the_shared_snapshot():
    parts, book, clock = broker_parts()
    mine, theirs = fail(book, "acme/search", clock()), fail(book, "globex", clock())
    dashboard = Dashboard(parts, monotonic=lambda: 0.0)  # one snapshot throughout
    acme = get(dashboard, "/api/overview", "acme-admin")[1]
    globex = get(dashboard, "/api/overview", "globex-viewer")[1]
    assert [f["id"] for f in acme["failures"]] == [mine] and [f["id"] for f in globex["failures"]] == [theirs]
    assert "globex" not in json.dumps(acme) and "acme" not in json.dumps(globex)
    # Asked again within the snapshot: the very bytes made for acme the first time.
    request = Request("GET", "/api/overview", {"authorization": "Bearer acme-admin"})
    assert dashboard.handle(request).body is dashboard.handle(request).body
    assert json.loads(dashboard.handle(request).body) == acme
