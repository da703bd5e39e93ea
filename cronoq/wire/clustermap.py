"""Which member of a cluster owns which pool: placement, and the cluster map the members hand out.

A cluster is a few brokers ("members") that share one `[cluster]` table in their config files and
partition the declared pools between them: every pool belongs to exactly one member, which alone accepts
and schedules its tasks, so fair sharing inside a pool stays exact. A pool is never split.

A pool's owner is the member its `member` key names, else the one rendezvous hashing picks: each member
scores the pool with a stable hash of (member, pool) and the highest score wins. Adding a member moves
only the pools it now wins; removing one moves only the pools it owned. The hash is blake2b, the same on
every host and every run (Python's `hash()` is salted per process, so it would not do).

Pure: no I/O, no clock. The broker asks `Cluster.owner`; `cluster_map` is the value of the `cluster`
request (docs/protocol.md), from which clients and workers route.

A task id made by a member starts with the member's name and a colon (`b2:3f0c...`), so any client can
tell which member to ask about it; `member_of_task` reads it back. Member names cannot hold a colon.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "Cluster",
    "Member",
    "TASK_ID_SEPARATOR",
    "cluster_map",
    "map_version",
    "member_of_task",
    "not_from",
    "rendezvous_owner",
]

TASK_ID_SEPARATOR = ":"


@dataclass(frozen=True)
class Member:
    """One member of a cluster: its name and the addresses of its endpoints (a primary first, then standbys)."""

    name: str
    clients: tuple[str, ...]
    workers: tuple[str, ...]


def _score(member: str, pool: str) -> int:
    digest = hashlib.blake2b(f"{member}\x00{pool}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(pool: str, members: Iterable[str]) -> str:
    """The member rendezvous (highest-random-weight) hashing places `pool` on; ties go to the smaller name."""
    best: tuple[int, str] | None = None
    for name in members:
        score = _score(name, pool)
        if best is None or score > best[0] or (score == best[0] and name < best[1]):
            best = (score, name)
    if best is None:
        raise ValueError("a cluster needs at least one member")
    return best[1]


@dataclass(frozen=True)
class Cluster:
    """The members of a cluster and the pools pinned to one of them (`member = "..."` on a pool)."""

    members: tuple[Member, ...]
    pinned: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        names = [m.name for m in self.members]
        if not names:
            raise ValueError("a cluster needs at least one member")
        if len(set(names)) != len(names):
            raise ValueError(f"member names must be unique, got {names}")
        unknown = sorted(set(self.pinned.values()) - set(names))
        if unknown:
            raise ValueError(f"pools pinned to unknown members: {unknown}")

    @property
    def names(self) -> list[str]:
        """The member names, in the order the config lists them."""
        return [m.name for m in self.members]

    def member(self, name: str) -> Member:
        """The member called `name`; KeyError if there is none."""
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

    def owner(self, pool: str) -> str:
        """The name of the member that owns `pool`."""
        pinned = self.pinned.get(pool)
        return pinned if pinned is not None else rendezvous_owner(pool, self.names)

    def placement(self, pools: Iterable[str]) -> dict[str, list[str]]:
        """Every member's pools, in the order given (members that own none have an empty list)."""
        out: dict[str, list[str]] = {name: [] for name in self.names}
        for pool in pools:
            out[self.owner(pool)].append(pool)
        return out


def map_version(members: list[dict[str, Any]]) -> str:
    """A short digest of the members, their addresses and pools: equal maps have equal versions on every
    member, and any change of placement gives another."""
    text = repr([(m["name"], m["clients"], m["workers"], sorted(m["pools"])) for m in members])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def cluster_map(cluster: Cluster, pools: Iterable[str], *, member: str, draining: Iterable[str] = ()) -> dict[str, Any]:
    """The value that answers a `cluster` request on member `member`.

    `members` lists each member with its addresses and the declared pools it owns; `draining` lists the
    pools the answering member still holds tasks of after a reload moved them away (its workers keep
    serving them until they are empty). `version` changes whenever the placement does.
    """
    placement = cluster.placement(pools)
    members = [{"name": m.name, "clients": list(m.clients), "workers": list(m.workers), "pools": placement[m.name]}
               for m in cluster.members]
    return {"version": map_version(members), "member": member, "members": members, "draining": sorted(draining)}


def member_of_task(task_id: str) -> str | None:
    """The member a task id names (its part before the first colon), or None for an id of a lone broker."""
    name, sep, _ = task_id.partition(TASK_ID_SEPARATOR)
    return name if sep and name else None


def not_from(value: Any, member: str) -> str | None:
    """Why a cluster map heard at member `member`'s addresses is not that member's own (None: it says it is).

    A map tells a client or worker where to send its token and its work, so one is only followed from the
    member the peer was asked as: a peer at b2's address that claims to be b1 (to take b1's pools away from it)
    is an impostor, or a member whose config differs from the others'. Without CURVE an address is all a peer
    can be checked by; with it, only a holder of the cluster's secret key completes a handshake at all.
    """
    claimed = value.get("member") if isinstance(value, Mapping) else None
    if claimed == member:
        return None
    return (f"it claims to come from member {claimed!r}, but that is member {member!r}'s address in the map "
            "followed so far (an impostor, or a config that differs between members)")

