"""The broker's `stats` answer, bounded whatever the number of tenants.

A pool's tenants are listed in full up to STATS_TENANTS. Beyond that a
reply lists the STATS_TENANTS busiest (most tasks queued, delayed and
running, then most dispatched) and says how many there are in all
(`tenant_count`); the pool's own counts still cover everyone. Finding the
busiest means looking at every tenant, which at 10^6 tenants takes a good
fraction of a second, so the search walks SCAN_STEP tenants per pass of the
broker's loop, and the request is answered when it ends. Requests that
arrive meanwhile share that search. The answer is then built a pool per
pass (a pool lists up to STATS_TENANTS tenants: about 2.5 ms), and shared
by the requests that came meanwhile: a client asking again and again costs
the loop no more than one asking once. (Before this, a `stats` with 10^6
tenants was an 84 MB reply that held the loop for 3.4 s; and until the
answer was built in steps, each request of a few pools of 1,000 tenants
held it for the whole build.)

The metrics endpoint cannot wait: `now()` answers at once with the tenants
the last search found, and starts a new search for the next scrape.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from cronoq.broker.auth import Principal
from cronoq.core import SchedulerCore

# Tenants per pool that a `stats` reply lists in full (about 100 bytes each on the wire).
STATS_TENANTS = 1000
# Tenants the search for the busiest looks at per pass of the loop (about 1 ms of work).
SCAN_STEP = 5000

Chosen = dict[str, list[str | None]]


class StatsReplies:
    """Answers `stats` from `pools_of(chosen, names)`, the stats of the pools named (all with None), where `chosen`
    names the tenants to list for the large pools (any other pool lists at most STATS_TENANTS), and `assemble`,
    which puts the broker's own counts around them."""

    def __init__(self, core: SchedulerCore, pools_of: Callable[[Chosen, tuple[str, ...] | None], dict[str, Any]],
                 assemble: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._core = core
        self._pools_of = pools_of
        self._assemble = assemble
        self._waiting: list[Callable[[dict[str, Any]], None]] = []
        self._scans: dict[str, Iterator[list[str | None] | None]] = {}
        self._found: Chosen = {}
        self._latest: Chosen = {}
        # The answer being built for the waiting requests, a pool per step: the tenants chosen, the pools left, and
        # the stats of those done.
        self._building: tuple[Chosen, Iterator[str], dict[str, Any]] | None = None

    @property
    def searching(self) -> bool:
        """Whether a search or an answer is under way (the loop must keep passing until it ends)."""
        return bool(self._scans) or self._building is not None

    def request(self, answer: Callable[[dict[str, Any]], None]) -> None:
        """Call `answer` with the stats once they are built, a pool per step (a pool's part walks up to
        STATS_TENANTS tenants): after a search for the busiest tenants when a pool has more. Requests that come
        meanwhile share the answer. When the pools hold STATS_TENANTS tenants in all or fewer (as much as one
        step would walk, and none of them a large pool), the answer is built at once."""
        if not self._scans and self._building is None and self._listed() <= STATS_TENANTS:
            answer(self._assemble(self._pools_of({}, None)))
            return
        self._waiting.append(answer)
        if self._building is None:
            self._start()

    def now(self) -> dict[str, Any]:
        """The stats at once: large pools list the tenants the last search found (before the first: any)."""
        return self._assemble(self._pools_of(self.latest(), None))

    def latest(self) -> Chosen:
        """The tenants the last search found busiest in each large pool (what `now()` lists), and a new search
        started for the next time."""
        self._start()
        return dict(self._latest)

    def step(self) -> None:
        """One step of the search, or of the answer (call once per pass); answers the waiting requests at the end."""
        if self._scans:
            pool, scan = next(iter(self._scans.items()))
            found = next(scan, None)
            if found is None and pool in self._core.pool_names():
                return  # more to walk (a pool that went meanwhile just drops out)
            del self._scans[pool]
            if found is not None:
                self._found[pool] = found
            if not self._scans:
                self._finish()
            return
        if self._building is None:
            return
        chosen, pools, built = self._building
        name = next(pools, None)
        if name is not None:
            built.update(self._pools_of(chosen, (name,)))
            return
        self._building = None
        value = self._assemble(built)
        waiting, self._waiting = self._waiting, []
        for answer in waiting:
            answer(value)

    def _start(self) -> None:
        if self._scans:
            return
        self._scans = {pool: self._core.busiest_tenants(pool, STATS_TENANTS, SCAN_STEP) for pool in self._large_pools()}
        if not self._scans:  # every pool is small again
            self._finish()

    def _finish(self) -> None:
        """The search ended: what it found lists next, and the waiting requests' answer is begun."""
        self._latest, self._found = self._found, {}
        if self._waiting and self._building is None:
            self._building = (dict(self._latest), iter(self._core.all_pool_names()), {})

    def _listed(self) -> int:
        """How many tenants the pools hold in all: more than STATS_TENANTS when one of them is large."""
        return sum(self._core.tenant_count(pool) for pool in self._core.all_pool_names())

    def _large_pools(self) -> list[str]:
        return [pool for pool in self._core.pool_names() if self._core.tenant_count(pool) > STATS_TENANTS]


# What of a pool a token pinned to a tenant is told beyond its subtree's own counts: the pool's settings and how many
# workers serve it. Nothing that counts other tenants' tasks (per-class counts, the virtual times, idle workers, the
# pool's dispatch rate, the broker's record and store counts) reaches it.
_POOL_SETTINGS = ("paused", "draining", "fair", "max_in_flight", "workers", "member", "share_by", "share_unit")
_SUBTREE_COUNTS = ("queued", "delayed", "running", "dispatched")


def visible_stats(stats: dict[str, Any], principal: Principal) -> dict[str, Any]:
    """The part of a stats map `principal` may see: all of it when it is not pinned to a tenant; when it is, per pool
    the settings and the tenants of its subtree, the pool's counts summed over those tenants (so over the tenants the
    map lists: in a pool of more than STATS_TENANTS tenants, those of the busiest it lists), and the ceilings of its
    subtree's nodes, and their rates and minimums. The lag of the pinned node itself, measured against siblings it may not see, is 0, and the
    weighted shares of its subtree are parts of the pinned node's (see `_seen_from_the_pin`)."""
    if principal.tenant is None:
        return stats
    pools = {name: _visible_pool(pool, principal) for name, pool in stats.get("pools", {}).items()}
    schedules = {name: s for name, s in stats.get("schedules", {}).items() if principal.may_see_tenant(s.get("tenant"))}
    extra = {"member": stats["member"]} if "member" in stats else {}
    return {**extra, "pools": pools, "workers": stats.get("workers", 0), "schedules": schedules,
            "memory": {}, "store": {}, "tenant": principal.tenant}


def _visible_pool(pool: dict[str, Any], principal: Principal) -> dict[str, Any]:
    def visible(entries: dict[str, Any]) -> dict[str, Any]:
        return {name: dict(entry) for name, entry in entries.items() if name and principal.may_see_tenant(name)}

    tenants = visible(pool.get("tenants", {}))
    nodes = visible(pool.get("tree_nodes", {}))  # ancestors without tasks of their own, when the stats list them
    _seen_from_the_pin(principal.tenant or "", tenants, nodes)
    ceilings = visible(pool.get("ceilings", {}))
    out: dict[str, Any] = {key: pool[key] for key in _POOL_SETTINGS if key in pool}
    out.update({key: sum(t[key] for t in tenants.values()) for key in _SUBTREE_COUNTS})
    out.update({"classes": {}, "tenants": tenants, "tenant_count": len(tenants), "ceilings": ceilings,
                "ceiling_count": len(ceilings)})
    for key in ("rates", "minimums"):  # a node's bucket and running count are its subtree's own
        if key in pool:
            out[key] = visible(pool[key])
    if "tree_nodes" in pool:
        out["tree_nodes"] = nodes
    return out


_SHARES = ("weighted_share", "own_weighted_share")


def _seen_from_the_pin(pinned: str, tenants: dict[str, Any], nodes: dict[str, Any]) -> None:
    """Make the pinned node's figures tell nothing of its siblings: its lag among them is 0, and every weighted
    share of its subtree is taken as a part of the pinned node's (which becomes 1). Below the pin a weighted share
    is the pinned node's times fractions among siblings inside the subtree, so the quotient is exact."""
    pin = tenants[pinned] if pinned in tenants else nodes.get(pinned)
    if pin is None:
        return
    pin["lag"] = 0.0
    scale = pin.get("weighted_share")
    for entry in (*tenants.values(), *nodes.values()):
        for key in _SHARES:
            value = entry.get(key)
            if value is not None:
                entry[key] = value / scale if scale else 0.0
