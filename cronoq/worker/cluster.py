"""How a worker serves a cluster: which member gets which of its pools, and how its slots are split.

Pure functions over the cluster map (docs/protocol.md, "Clusters"); `cronoq.Worker` acts on them.

The credit is split, not shared. A broker only ever holds the credit a worker gave it, and the protocol has
no way to take credit back from an idle member, so a budget shared on the fly would mean granting one slot
at a time and a round trip per task. A static split costs nothing per task and can never exceed
`concurrency`. Each member that owns some of the worker's pools gets a share in proportion to how many of
them it owns (at least one slot each); the worker also runs at most `concurrency` handlers at once whatever
the brokers hand it, so a map change that shrinks a share while its slots are busy cannot push it over.
docs/scaling.md says what this costs and when to run one worker per member instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cronoq.errors import InvalidArgument


def wanted_pools(value: Mapping[str, Any], mine: Iterable[str],
                 draining: Mapping[str, Iterable[str]]) -> dict[str, tuple[list[str], list[str]]]:
    """Per member name: (the worker's pools it owns, the worker's pools it is still draining), for each member
    with either. `draining` holds what each member last said it drains (only a member knows its own)."""
    mine = list(mine)
    out: dict[str, tuple[list[str], list[str]]] = {}
    for member in value.get("members", ()):
        name = member["name"]
        owned = set(member.get("pools", ()))
        here = [pool for pool in mine if pool in owned]
        drains = set(draining.get(name, ()))
        leftover = [pool for pool in mine if pool in drains and pool not in owned]
        if here or leftover:
            out[name] = (here, leftover)
    return out


def split_slots(concurrency: int, owned: Mapping[str, int]) -> dict[str, int]:
    """`concurrency` slots over the members, in proportion to how many of the worker's pools each owns (largest
    remainders first, ties by name), at least one each. InvalidArgument when there are more members than slots."""
    if not owned:
        return {}
    if len(owned) > concurrency:
        raise InvalidArgument(
            f"concurrency {concurrency} is less than the {len(owned)} cluster members that own this worker's pools "
            f"({', '.join(sorted(owned))}); give it at least {len(owned)}, or run one worker per member")
    weights = {name: max(1, count) for name, count in owned.items()}
    total = sum(weights.values())
    exact = {name: concurrency * w / total for name, w in weights.items()}
    shares = {name: max(1, int(x)) for name, x in exact.items()}
    # Largest remainders: take from those furthest above their exact share, give to those furthest below.
    while sum(shares.values()) > concurrency:
        name = max((n for n in shares if shares[n] > 1), key=lambda n: (shares[n] - exact[n], n))
        shares[name] -= 1
    while sum(shares.values()) < concurrency:
        name = max(shares, key=lambda n: (exact[n] - shares[n], n))
        shares[name] += 1
    return shares
