"""The dashboard's routes: the page, its JSON API, its admin actions, and who may use them.

Every /api/ request is authorized like a message on the broker's sockets:
with `[[auth.tokens]]` configured it must carry `Authorization: Bearer
<token>` of an admin or viewer token (pause, resume and cancel take an
admin); without tokens the broker is open and so is the dashboard. The
page, its script and its styles are served to anyone: they hold no data,
and the page asks for the token before it asks for any.

The overview is one snapshot, built at most once per SNAPSHOT_INTERVAL and
shared, encoded, by every viewer: a hundred browsers cost what one does. A
token pinned to a tenant sees its subtree alone (the broker's
`visible_stats`, then the rows, failures and workers cut to match), built
from the same reading. A timer samples the stats every SAMPLE_INTERVAL for
the shares over time (cronoq.broker.dashboard.history) and the recent shares'
window, whether or not anyone is looking.
The admin actions go through the broker's `act`, which commits them to the
journal before the answer leaves, as the same actions on the client socket.
See docs/dashboard.md for each endpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import socket
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any, Awaitable, Callable, Generator, Iterable

import msgspec

from cronoq.answers import Explanation

from cronoq.answers import explain_text
from cronoq.book.taskbook import TaskBook, unknown_task
from cronoq.broker.auth import OPEN, Principal
from cronoq.broker.dashboard.history import SAMPLE_INTERVAL, ShareHistory
from cronoq.broker.hosts import host_problem, origin_problem
from cronoq.broker.dashboard.http import HttpServer, Request, Response, plain
from cronoq.broker.dashboard.tables import DispatchHistory, dispatch_counts, failure_row, pool_view, worker_rows
from cronoq.broker.failures import MAX_TRACEBACK_CHARS, RecentFailures, cut
from cronoq.broker.metrics import DashboardConnections
from cronoq.broker.statistics import visible_stats
from cronoq.core import PoolSettings, SchedulerCore
from cronoq.errors import CronoqError, InvalidArgument, NotFound, PermissionDenied, Unauthenticated

log = logging.getLogger("cronoq.dashboard")

# Seconds an overview snapshot is served before the next request builds a new one.
SNAPSHOT_INTERVAL = 1.0
# The header every POST must carry. A page of another site cannot send it without the browser first asking
# this server's leave (CORS), which it never gives: so no other site can make a browser pause a pool.
ACTION_HEADER = "x-cronoq-dashboard"
MAX_ID_LENGTH = 200

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503,
}
_POOL_ACTION = re.compile(r"/api/pools/(?P<pool>[^/]+)/(?P<action>pause|resume)")
_TASK = re.compile(r"/api/tasks/(?P<id>[^/]+)")
_TASK_CANCEL = re.compile(r"/api/tasks/(?P<id>[^/]+)/cancel")
_FAILURE = re.compile(r"/api/failures/(?P<id>[^/]+)")
_HISTORY = re.compile(r"/api/history/(?P<pool>[^/]+)")


@dataclass(frozen=True)
class BrokerParts:
    """What the dashboard reads and steers of a running broker (the broker builds it: see Broker.start_dashboard)."""

    stats: Callable[[], dict[str, Any]]
    """The broker's stats map, at once (Broker.stats)."""
    identify: Callable[[bytes], Principal]
    """The principal of a token by the broker's current tokens (an open broker: an admin for any)."""
    pools: Callable[[], Iterable[PoolSettings]]
    """The pools of the running config (node weights of a tenant tree's ancestors come from there)."""
    core: SchedulerCore
    book: TaskBook
    workers: Callable[[], list[dict[str, Any]]]
    """Each worker: name, pools, busy, concurrency, leaving, last_seen_at (broker clock)."""
    failures: RecentFailures
    act: Callable[[Callable[[float], Any]], Any]
    """Run an admin action (given the broker's time) and commit it before returning its result."""
    clock: Callable[[], float]
    explain: Callable[[str, str | None], Any] | None = None
    """The broker's `explain(task_id, scope)` (why it waits, how its attempts ended; `scope` the tenant the viewer
    is pinned to, if any); the task view includes it."""
    hosts: Callable[[], Iterable[str]] = lambda: ()
    """The names the dashboard answers to besides its addresses and localhost (`[broker] dashboard_hosts`, as the
    running config has them)."""
    connections: DashboardConnections = dataclasses.field(default_factory=DashboardConnections)
    """Where the HTTP server counts the connections it ends early (the broker's metrics)."""
    stats_in_steps: Callable[[], Awaitable[dict[str, Any]]] | None = None
    """The same map, taken a pool per turn of the loop (Broker.stats_in_steps), for the sample and the overview;
    None: at once."""
    pinned_tenants: Callable[[], Iterable[str]] = lambda: ()
    """The tenants the broker's current tokens are pinned to: the shares over time follow their nodes, for the
    charts of those tokens."""


def task_view(parts: BrokerParts, principal: Principal, task_id: str) -> dict[str, Any]:
    """What the dashboard shows of one task: its status and attempts as `status` reports them, its error and
    traceback, and the broker's explanation of it (`parts.explain`, as `cronoq explain` shows it). NotFound, worded as
    for an id that never existed, when the task is unknown or not the principal's to see."""
    record = parts.book.get(task_id)
    if not principal.may_see_tenant(record.tenant):
        raise unknown_task(task_id)
    view = dataclasses.asdict(parts.book.info(task_id))
    view["traceback"] = cut(record.traceback, MAX_TRACEBACK_CHARS)
    if parts.explain is not None:
        explanation = parts.explain(task_id, principal.tenant)  # scoped to what a pinned token may see
        view["explain"] = explanation
        view["explain_text"] = explain_text(msgspec.convert(explanation, Explanation))
    return view


@dataclass(frozen=True)
class _Reading:
    """What one overview snapshot is built from: the broker's stats, the recent dispatches, the workers."""

    now: float
    stats: dict[str, Any]
    recent: dict[str, dict[str, int]]
    covers: float | None
    workers: list[dict[str, Any]]


class Dashboard:
    """The web dashboard of one broker: `start(address)` serves it on the running loop, `close()` stops it."""

    def __init__(self, parts: BrokerParts, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._parts = parts
        self._monotonic = monotonic
        self._history = DispatchHistory()
        self._shares = ShareHistory()
        self._sampler: asyncio.TimerHandle | None = None
        self._sampling: asyncio.Future[None] | None = None  # a sample under way, a pool per turn of the loop
        self._snapshot: tuple[float, _Reading, bytes] | None = None
        self._rebuilding: asyncio.Future[None] | None = None  # a new snapshot under way, a pool per turn of the loop
        self._rebuilding_since = 0  # the admin actions there had been when it began
        self._snapshots_forgotten = 0  # admin actions so far: a rebuild begun before one is not kept
        # Pinned tenants' views of the snapshot `_pinned_of` (one per token's tenant), made anew with each snapshot.
        self._pinned_of: tuple[float, _Reading, bytes] | None = None
        self._pinned_views: dict[str, bytes] = {}
        # The /api/history answers made since the last sample, by (pinned tenant, pool or None for all): at most
        # one per token's tenant and pool, thrown away at the next sample.
        self._series_version = -1
        self._series_made: dict[tuple[str | None, str | None], bytes] = {}
        self._static = {path: (_read_static(name), kind) for path, (name, kind) in _STATIC.items()}
        self._served_host: str | None = None
        self.server = HttpServer(self.handle, counts=parts.connections)

    async def start(self, address: str, sockets: list[socket.socket] | None = None) -> tuple[str, int]:
        """Listen on "host:port" (on `sockets` when given: bound to it already, by a standby that held them);
        returns the address bound. Raises OSError when it cannot be bound."""
        self._served_host = address.rpartition(":")[0].strip("[]") or None
        bound = await self.server.start(address, sockets)
        log.info("dashboard at http://%s:%d/", *bound)
        self.sample()
        return bound

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None
        for running in (self._sampling, self._rebuilding):
            if running is not None:
                running.cancel()
        self._sampling = self._rebuilding = None
        self.server.close()

    def sample(self) -> None:
        """Take a sample of the stats for the shares over time and the recent shares, and again in SAMPLE_INTERVAL:
        on a timer, so the chart covers the last minutes whether or not anyone was looking. The sample is taken a
        pool per turn of the loop (a pool's part walks up to 1,000 tenants): it never holds the loop for all pools."""
        if self._sampling is None or self._sampling.done():
            self._sampling = asyncio.ensure_future(self._sample())
        self._sampler = asyncio.get_running_loop().call_later(SAMPLE_INTERVAL, self.sample)

    async def _sample(self) -> None:
        try:
            now = self._parts.clock()
            in_steps = self._parts.stats_in_steps
            stats = self._parts.stats() if in_steps is None else await in_steps()
            weights = {pool.name: pool for pool in self._parts.pools()}

            def weight_of(pool: str, node: str) -> float:
                # Asked for every node of every pool: a pool's settings are made only for one not in the config.
                settings = weights.get(pool)
                return (PoolSettings(pool) if settings is None else settings).weight(node)

            pools = stats.get("pools", {})
            pins = set(self._parts.pinned_tenants())
            for name in self._shares.followed(pools):
                self._shares.sample_pool(now, name, pools[name], weight_of, pins)
                await asyncio.sleep(0)
            self._history.recent(now, dispatch_counts(stats))
        except Exception:  # a bug: it must cost a point of the chart, never the broker
            log.exception("the dashboard failed to sample the broker's stats")

    # ----------------------------------------------------------------- routing

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        """Answer one request (see docs/dashboard.md), or (an answer made over turns of the loop) give what to
        await for it. The answer says whether the request carried a token of a viewer or admin (`authenticated`):
        the server keeps room for such connections."""
        problem = host_problem(request.headers.get("host"), self._served_host, self._parts.hosts())
        if problem is not None:
            return Response(421, _json({"error": {"code": "PERMISSION_DENIED", "message": problem}}))
        path, method = request.path, request.method
        if not path.startswith("/api/"):
            static = self._static.get(path)
            if static is None:
                return plain(404, "not found; the dashboard is at /")
            if method not in ("GET", "HEAD"):
                return _method_not_allowed("GET")
            return Response(200, static[0], static[1])
        try:
            principal = self._principal(request)
            principal.require("dashboard")
        except CronoqError as exc:
            return _refusal(exc)
        try:
            response = self._api(request, principal)
        except CronoqError as exc:
            response = _refusal(exc)
        if not isinstance(response, Response):
            return self._answered(response, principal)
        # An open broker has no tokens to tell its users by: nobody's connection is kept room for.
        return response if principal is OPEN else dataclasses.replace(response, authenticated=True)

    async def _answered(self, pending: Awaitable[Response], principal: Principal) -> Response:
        try:
            response = await pending
        except CronoqError as exc:
            response = _refusal(exc)
        return response if principal is OPEN else dataclasses.replace(response, authenticated=True)

    def _api(self, request: Request, principal: Principal) -> Response | Awaitable[Response]:
        path = request.path
        if request.method == "POST":
            if ACTION_HEADER not in request.headers:
                raise PermissionDenied(f"an action must carry the header {ACTION_HEADER}: 1 (the page sends it)")
            problem = origin_problem(request.headers.get("origin"), self._served_host, self._parts.hosts())
            if problem is not None:
                raise PermissionDenied(problem)
            if (match := _POOL_ACTION.fullmatch(path)) is not None:
                return self._pool_action(principal, match["pool"], match["action"])
            if (match := _TASK_CANCEL.fullmatch(path)) is not None:
                return self._cancel(principal, _task_id(match["id"]))
        elif request.method in ("GET", "HEAD"):
            if path == "/api/overview":
                return self._overview(principal)
            if path == "/api/session":
                return Response(200, _json({"role": principal.role, "auth": principal is not OPEN,
                                            "may_act": principal.allows("pause"), "interval": SNAPSHOT_INTERVAL,
                                            "tenant": principal.tenant}))
            if path == "/api/history":
                made = self._series_made_for(principal, None)
                return Response(200, made) if made is not None else self._all_shares_over_time(principal)
            if (match := _HISTORY.fullmatch(path)) is not None:
                return Response(200, self._shares_over_time(principal, match["pool"]))
            if (match := _TASK.fullmatch(path)) is not None:
                return Response(200, _json(task_view(self._parts, principal, _task_id(match["id"]))))
            if (match := _FAILURE.fullmatch(path)) is not None:
                return Response(200, _json(self._failure(principal, _task_id(match["id"]))))
        else:
            return _method_not_allowed("GET, POST")
        raise NotFound(f"no dashboard endpoint {request.method} {path}; see docs/dashboard.md")

    def _principal(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if header and scheme.lower() != "bearer":
            raise Unauthenticated("send the token as `Authorization: Bearer <token>`")
        token = token.strip()
        try:
            return self._parts.identify(token.encode())
        except Unauthenticated:
            if token:
                raise
            # The sockets' wording (a token= argument of cronoq.connect) means nothing to someone with a browser.
            raise Unauthenticated(
                "this dashboard asks for a token: open the dashboard's page (/) in a browser and enter an admin or "
                "viewer token, or send one as `Authorization: Bearer <token>`") from None

    # ----------------------------------------------------------------- reading

    def _overview(self, principal: Principal) -> Response | Awaitable[Response]:
        """The shared snapshot, encoded, built a pool per turn of the loop (`_rebuild`): a broker with many large
        pools is never held for all of them at once. Once it is SNAPSHOT_INTERVAL old a new one is begun behind
        it, and it is served meanwhile; when there is none (the first request, and the first after an admin's
        action, which must show it) the request waits for the new one. A token pinned to a tenant gets a view of
        its own built from the same reading (see `_view`)."""
        now = self._monotonic()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # (called outside a loop, as a test may: built here and now)
            if self._snapshot is None or now - self._snapshot[0] >= SNAPSHOT_INTERVAL:
                self._snapshot = self._built_at_once(now)
            return Response(200, self._seen_by(principal))
        if self._snapshot is None:
            return self._overview_once_built(principal, self._rebuild_begun(now))
        if now - self._snapshot[0] >= SNAPSHOT_INTERVAL:
            self._rebuild_begun(now)
        return Response(200, self._seen_by(principal))

    def _rebuild_begun(self, now: float) -> asyncio.Future[None]:
        """The rebuild under way, or a new one: one begun before the last admin action is not kept, so it does
        not count."""
        running = self._rebuilding
        if running is None or running.done() or self._rebuilding_since != self._snapshots_forgotten:
            running = self._rebuilding = asyncio.ensure_future(self._rebuild(now))
            self._rebuilding_since = self._snapshots_forgotten
        return running

    async def _overview_once_built(self, principal: Principal, rebuilding: asyncio.Future[None]) -> Response:
        await asyncio.shield(rebuilding)  # shared by every request waiting: one's going away is not all's
        if self._snapshot is None:  # the rebuild failed (it logged why), or an action came meanwhile
            self._snapshot = self._built_at_once(self._monotonic())
        return Response(200, self._seen_by(principal))

    def _seen_by(self, principal: Principal) -> bytes:
        """The snapshot as `principal` may see it, encoded."""
        snapshot = self._snapshot
        assert snapshot is not None
        _, reading, encoded = snapshot
        if principal.tenant is None:
            return encoded
        # A pinned tenant's view, made once per snapshot (a view walks the tenants the stats list: about 1 ms).
        if self._pinned_of is not snapshot:
            self._pinned_of, self._pinned_views = snapshot, {}
        view = self._pinned_views.get(principal.tenant)
        if view is None:
            view = self._pinned_views[principal.tenant] = _json(self._view(reading, principal))
        return view

    def _built_at_once(self, now: float) -> tuple[float, _Reading, bytes]:
        reading = self._read(self._parts.stats())
        return now, reading, _json(self._view(reading, OPEN))

    def _forget_snapshot(self) -> None:
        """The next poll waits for a new overview (an admin's action shows at once). A rebuild under way then keeps
        what it read before the action to itself."""
        self._snapshot = None
        self._snapshots_forgotten += 1

    async def _rebuild(self, started: float) -> None:
        """A new shared snapshot, read and built a pool per turn of the loop."""
        forgotten = self._snapshots_forgotten
        try:
            in_steps = self._parts.stats_in_steps
            reading = self._read(self._parts.stats() if in_steps is None else await in_steps())
            steps = self._view_steps(reading, OPEN)
            try:
                while True:
                    next(steps)
                    await asyncio.sleep(0)
            except StopIteration as done:
                view = done.value
            if forgotten == self._snapshots_forgotten:
                self._snapshot = (started, reading, _json(view))
        except Exception:  # a bug: it must cost the page a refresh, never the broker
            log.exception("the dashboard failed to build its overview")

    def _read(self, stats: dict[str, Any]) -> _Reading:
        parts = self._parts
        now = parts.clock()
        recent, covers = self._history.recent(now, dispatch_counts(stats))
        return _Reading(now, stats, recent, covers, parts.workers())

    def _view(self, reading: _Reading, principal: Principal) -> dict[str, Any]:
        """The overview as `principal` may see it. A token pinned to a tenant sees its subtree alone, as if no other
        tenant existed: the rows of its subtree (shares and weighted shares among them), the pools' counts summed
        over them, their failures, the workers without their busy slots (which count other tenants' tasks), and, for
        a pool's dispatch rate, its subtree's over the share window."""
        steps = self._view_steps(reading, principal)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _view_steps(self, reading: _Reading, principal: Principal) -> Generator[None, None, dict[str, Any]]:
        """`_view`, pausing after each pool (a pool's rows walk up to 1,000 tenants): what it yields is nothing,
        what it returns the view."""
        parts = self._parts
        settings = {pool.name: pool for pool in parts.pools()}
        pools = []
        for name, pool in sorted(visible_stats(reading.stats, principal).get("pools", {}).items()):
            weight_of = settings.get(name, PoolSettings(name)).weight
            recent = reading.recent.get(name, {})
            if principal.tenant is None:
                pools.append(pool_view(name, pool, recent, weight_of,
                                       lambda node, pool_name=name: parts.core.lag(pool_name, node)))
            else:
                pools.append(self._pinned_pool_view(name, pool, recent, weight_of, principal.tenant, reading.covers))
            yield
        workers = worker_rows(reading.workers, reading.now)
        if principal.tenant is not None:
            workers = [{**w, "busy": None} for w in workers]
        return {
            "now": reading.now,
            "interval": SNAPSHOT_INTERVAL,
            "share_window": reading.covers,
            "workers_connected": len(reading.workers),
            "pools": pools,
            "workers": workers,
            "failures": [failure_row(f) for f in parts.failures if principal.may_see_tenant(f.tenant)],
        }

    def _pinned_pool_view(self, name: str, pool: dict[str, Any], recent: dict[str, int],
                          weight_of: Callable[[str], float], pinned: str, covers: float | None) -> dict[str, Any]:
        """A pool as a token pinned to `pinned` sees it, from its visible stats (`visible_stats`): the rows of its
        subtree, its node the top one; the rate its subtree's over the share window."""
        recent = {tenant: n for tenant, n in recent.items() if tenant in pool["tenants"]}
        view = pool_view(name, pool, recent, weight_of,
                         lambda node: 0.0 if node == pinned else self._parts.core.lag(name, node))
        # The ancestors the tree adds above the pin are not the token's to see.
        depth = pinned.count("/")
        view["tenants"] = [{**row, "depth": row["depth"] - depth} for row in view["tenants"]
                           if row["tenant"] == pinned or row["tenant"].startswith(pinned + "/")]
        view["dispatch_rate"] = sum(recent.values()) / covers if covers else 0.0
        return view

    def _series_made_for(self, principal: Principal, pool: str | None) -> bytes | None:
        """The /api/history answer made for this principal's tenant and `pool` (None: all) since the last sample.
        The series change only when a sample is taken, so each answer is made once per sample: asked again and
        again it costs the loop nothing more. At most one per token's tenant and pool is kept."""
        if self._series_version != self._shares.version:
            self._series_version, self._series_made = self._shares.version, {}
        return self._series_made.get((principal.tenant, pool))

    def _shares_over_time(self, principal: Principal, pool: str) -> bytes:
        """GET /api/history/POOL, encoded: one pool's shares over the last minutes (cronoq.broker.dashboard.history)."""
        made = self._series_made_for(principal, pool)
        if made is None:
            series = self._shares.series(pool, principal.tenant)
            if series is None:
                followed = ", ".join(self._shares.pools()) or "none yet"
                raise NotFound(f"no pool named {pool!r} is followed; pools: {followed}")
            made = self._series_made[(principal.tenant, pool)] = _json({"interval": SAMPLE_INTERVAL,
                                                                        "pools": {pool: series}})
        return made

    async def _all_shares_over_time(self, principal: Principal) -> Response:
        """GET /api/history, made a pool per turn of the loop (a pool's ten minutes take about 2 ms to make: all 64
        at once would hold the loop for 140)."""
        version = self._shares.version
        series = {}
        for name in self._shares.pools():
            one = self._shares.series(name, principal.tenant)
            if one is not None:  # (None: a pool the config dropped meanwhile)
                series[name] = one
            await asyncio.sleep(0)
        made = _json({"interval": SAMPLE_INTERVAL, "pools": series})
        if self._series_version == version == self._shares.version:  # (no sample came meanwhile)
            self._series_made[(principal.tenant, None)] = made
        return Response(200, made)

    def _failure(self, principal: Principal, task_id: str) -> dict[str, Any]:
        failure = self._parts.failures.find(task_id)
        if failure is None or not principal.may_see_tenant(failure.tenant):
            raise NotFound(f"no recent failure of task {task_id!r} (the dashboard keeps the last "
                           f"{self._parts.failures.size}); its status may still be known: GET /api/tasks/{task_id}")
        return failure_row(failure, with_traceback=True)

    # ----------------------------------------------------------------- acting

    def _pool_action(self, principal: Principal, pool: str, action: str) -> Response:
        principal.require(action)
        book = self._parts.book
        if pool not in book.core.pool_names():
            raise NotFound(f"no pool named {pool!r}; declared pools: {', '.join(sorted(book.core.pool_names()))}")
        self._parts.act(lambda now: book.pause(pool) if action == "pause" else book.resume(pool))
        self._forget_snapshot()  # the next poll shows it
        log.info("dashboard: pool %s %s by %s", pool, "paused" if action == "pause" else "resumed", principal.name)
        return Response(200, _json({"pool": pool, "paused": action == "pause"}))

    def _cancel(self, principal: Principal, task_id: str) -> Response:
        principal.require("cancel")
        record = self._parts.book.get(task_id)
        if not principal.may_see_tenant(record.tenant):
            raise unknown_task(task_id)
        cancelled = self._parts.act(lambda now: self._parts.book.cancel(task_id, now))
        self._forget_snapshot()
        return Response(200, _json({"id": task_id, "cancelled": bool(cancelled)}))


def _task_id(text: str) -> str:
    if not text or len(text) > MAX_ID_LENGTH or not text.isprintable():
        raise InvalidArgument(f"a task id is 1 to {MAX_ID_LENGTH} printable characters")
    return text


def _refusal(exc: CronoqError) -> Response:
    headers = [("WWW-Authenticate", 'Bearer realm="cronoq"')] if isinstance(exc, Unauthenticated) else []
    return Response(_HTTP_STATUS.get(exc.code, 400), _json({"error": {"code": exc.code, "message": exc.message}}),
                    headers=headers)


def _method_not_allowed(allowed: str) -> Response:
    response = plain(405, f"method not allowed; this path takes {allowed}")
    return dataclasses.replace(response, headers=[("Allow", allowed)])


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _read_static(name: str) -> bytes:
    return resources.files("cronoq.broker.dashboard").joinpath("static", name).read_bytes()


__all__ = ["ACTION_HEADER", "BrokerParts", "Dashboard", "SNAPSHOT_INTERVAL", "task_view"]
