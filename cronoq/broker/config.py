"""The broker's configuration: reading the TOML file and validating every key.

This module is the one place the config rules (docs/configuration.md)
live. It fails closed: an unknown key, a wrong type, a value out of range, a
duplicate pool or an unset `token_env` variable is a `ConfigError` whose
message names the file, the key, what is wrong and what would be valid. The
broker calls `load_config` at start-up and again on SIGHUP; a bad file raises
before anything is bound or swapped, so the running config stays.

Secrets are read from the environment here and never appear in a message.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from cronoq.book.retention import DEFAULT_RETENTION_BYTES
from cronoq.broker.schedules import Schedule
from cronoq.core.checks import check_settings, tenant_problem
from cronoq.core.settings import PRIORITIES, SHARE_BY, PoolSettings
from cronoq.errors import ConfigError, InvalidArgument, ScheduleError
from cronoq.wire.clustermap import Cluster, Member
from cronoq.wire.protocol import MAX_NAME_CHARS

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "PoolLimits",
    "TokenSpec",
    "default_config",
    "load_config",
    "override",
    "parse_config",
]

DEFAULT_CLIENTS = "tcp://127.0.0.1:5555"
DEFAULT_WORKERS = "tcp://127.0.0.1:5556"
DEFAULT_DATA_DIR = "cronoq-data"
DEFAULTS_SOURCE = "<defaults>"

DURABILITIES: tuple[str, ...] = ("sync", "none", "fsync")
"""sync: written to the OS before acknowledging (fdatasync'ed within a second); none: memory only;
fsync: fdatasync'ed before acknowledging (see docs/durability.md)."""
ROLES: tuple[str, ...] = ("client", "worker", "admin", "viewer")
ENDPOINT_SCHEMES: tuple[str, ...] = ("tcp://", "ipc://", "inproc://")

_POOL_NAME = re.compile(r"[A-Za-z0-9._-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A line whose key is a tenant path written bare (acme/search = 2): TOML's bare keys cannot hold "/".
_BARE_TENANT_PATH = re.compile(r"^\s*(?P<key>[A-Za-z0-9_-]+(?:\s*/\s*[A-Za-z0-9_.-]+)+)\s*=")
_TOML_POSITION = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.DOTALL)


@dataclass(frozen=True)
class TokenSpec:
    """One accepted token: its secret (from `token_env`), its role and its optional tenant."""

    secret: bytes = field(repr=False)
    role: str
    tenant: str | None
    token_env: str


@dataclass(frozen=True)
class PoolLimits:
    """Backlog caps of one pool (`None` = no cap): queued tasks in all, and per tenant."""

    max_backlog: int | None = None
    max_tenant_backlog: int | None = None


def _default_pools() -> tuple[PoolSettings, ...]:
    return (PoolSettings("default"),)


def _default_limits() -> Mapping[str, PoolLimits]:
    return MappingProxyType({"default": PoolLimits()})


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    """A validated broker configuration.

    `source` is the config path as given (or ``"<defaults>"``); it prefixes
    every message about this config. Paths are absolute. `data_dir` is `None`
    exactly when `durability` is ``"none"``. `pools` lists the declared pools
    in file order (only ``default`` when none is declared) and `limits` has an
    entry for each of them. An empty `tokens` means an open broker.
    `schedules` holds the validated ``[[schedules]]`` entries (see cronoq.broker.schedules).
    """

    source: str
    clients: str = DEFAULT_CLIENTS
    workers: str = DEFAULT_WORKERS
    data_dir: Path | None
    durability: str = "sync"
    metrics: str | None = None
    dashboard: str | None = None
    """Where the web dashboard listens ("HOST:PORT", see cronoq.broker.dashboard), or None: off."""
    dashboard_hosts: tuple[str, ...] = ()
    """Names (each "NAME" or "NAME:PORT") the dashboard answers to besides its IP addresses, `localhost` and the
    host of `dashboard`: the names users reach it by through a proxy or DNS (cronoq.broker.hosts)."""
    metrics_hosts: tuple[str, ...] = ()
    """Names (each "NAME" or "NAME:PORT") scrapers reach the metrics by. Empty: the metrics on a loopback address
    answer to IP addresses and `localhost` only, on any other to every name; given, on any address they answer to
    those, IP addresses, `localhost` and the host of `metrics` (cronoq.broker.exposition.browser_problem)."""
    heartbeat_interval: float = 1.0
    liveness: int = 3
    max_payload_bytes: int = 1048576
    max_deliveries: int = 5
    result_ttl: float = 86400.0
    result_retention_bytes: int = DEFAULT_RETENTION_BYTES
    results_store: bool = True
    """With a data_dir: whether finished tasks move to the results store (and leave memory), or stay in memory and
    the journal, within result_ttl and result_retention_bytes (docs/durability.md, "Without the results store")."""
    auth_timeout: float = 5.0
    max_connections: int | None = None
    """None: as many as the open-file limit leaves room for, at most DEFAULT_MAX_CONNECTIONS."""
    connection_buffer_bytes: int = 4 * 1048576
    pools: tuple[PoolSettings, ...] = field(default_factory=_default_pools)
    limits: Mapping[str, PoolLimits] = field(default_factory=_default_limits)
    tokens: tuple[TokenSpec, ...] = ()
    curve_secret_key_file: Path | None = None
    schedules: tuple[Schedule, ...] = ()
    member: str | None = None
    """This broker's name in `cluster` (None: a lone broker)."""
    cluster: Cluster | None = None
    """The `[cluster]` table: the members and the pools pinned to one (None: a lone broker owning every pool)."""

    @property
    def owned_pools(self) -> tuple[PoolSettings, ...]:
        """The declared pools this broker schedules: all of them, or in a cluster those its member owns."""
        if self.cluster is None:
            return self.pools
        return tuple(pool for pool in self.pools if self.cluster.owner(pool.name) == self.member)

    @property
    def auth_enabled(self) -> bool:
        """Whether every message must carry a valid token."""
        return bool(self.tokens)


def default_config(cwd: Path | None = None) -> BrokerConfig:
    """The built-in defaults (`cronoq-broker` with no -c), with durable state in `cwd`/cronoq-data."""
    base = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
    return BrokerConfig(source=DEFAULTS_SOURCE, data_dir=base / DEFAULT_DATA_DIR)


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *,
                member: str | None = None) -> BrokerConfig:
    """Read and validate the config file at `path`; raise `ConfigError` if it is unusable.

    Relative paths in the file are taken relative to the file's directory;
    token secrets come from `environ` (default: `os.environ`). `member`
    (`cronoq-broker --member`) overrides `[broker] member`.
    """
    source = os.fsdecode(os.fspath(path))
    try:
        with open(source, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"{source}: cannot read: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: {_toml_problem(str(e), raw)}") from None
    base_dir = Path(os.path.abspath(os.path.dirname(source)))
    return parse_config(data, source=source, base_dir=base_dir, environ=os.environ if environ is None else environ,
                        member=member)


def parse_config(data: Mapping[str, Any], *, source: str, base_dir: Path, environ: Mapping[str, str],
                 member: str | None = None) -> BrokerConfig:
    """Validate already-parsed TOML `data`; `source` names it in messages, `base_dir` anchors relative paths;
    `member`, when given, overrides `[broker] member` (the command line's --member)."""
    top = _Section(source, "", _table(source, "config", data), ("auth", "broker", "cluster", "pools", "schedules"))
    broker_section = top.subsection("broker", _BROKER_KEYS)
    broker = _broker_settings(broker_section, base_dir)
    pools, limits = _pools(top)
    broker.update(_cluster_settings(top, broker_section, base_dir, member, pools))
    return BrokerConfig(
        source=source,
        pools=pools,
        limits=limits,
        tokens=_tokens(top, environ),
        schedules=_schedules(top, {pool.name for pool in pools}),
        **broker,
    )


def override(config: BrokerConfig, *, clients: str | None = None, workers: str | None = None,
             data_dir: str | None = None, cwd: Path | None = None) -> BrokerConfig:
    """`config` with the endpoints and data_dir given on the command line (None: keep the file's).

    Each value is checked as its config key is; a ConfigError names the flag. A relative `data_dir` is taken
    from `cwd` (default: the working directory), as any path on a command line. With durability = "none" a
    data_dir has no effect, as in the file.
    """
    values: dict[str, Any] = {}
    for flag, key, value in (("--clients", "clients", clients), ("--workers", "workers", workers)):
        if value is not None:
            try:
                values[key] = _endpoint(value)
            except _Invalid as e:
                raise ConfigError(f"{flag}: {e}") from None
    if data_dir is not None:
        if not data_dir:
            raise ConfigError("--data-dir: expected a directory, got an empty string")
        base = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
        values["data_dir"] = None if config.durability == "none" else _resolve(base, data_dir)
    new_clients, new_workers = values.get("clients", config.clients), values.get("workers", config.workers)
    if new_clients == new_workers and not _is_ephemeral(new_clients):
        flag = "--workers" if "workers" in values else "--clients"
        raise ConfigError(f"{flag}: the client and worker endpoints would both be {new_clients!r}; "
                          "give each socket its own endpoint")
    return dataclasses.replace(config, **values) if values else config


# --- sections -----------------------------------------------------------------

_BROKER_KEYS = (
    "clients", "workers", "data_dir", "durability", "metrics", "metrics_hosts", "dashboard", "dashboard_hosts",
    "heartbeat_interval", "liveness", "max_payload_bytes", "max_deliveries", "result_ttl", "result_retention_bytes", "results_store",
    "curve_secret_key_file", "auth_timeout", "max_connections", "connection_buffer_bytes", "member",
)  # fmt: skip
_POOL_KEYS = (
    "name", "tenant_weights", "fair_share", "max_in_flight", "max_backlog", "max_tenant_backlog",
    "tenant_limits", "default_weight", "default_tenant_limit", "member", "share_by", "tenant_rates",
    "tenant_minimums",
)  # fmt: skip
_MEMBER_KEYS = ("name", "clients", "workers")
_TOKEN_KEYS = ("token_env", "role", "tenant")
_SCHEDULE_KEYS = (
    "name", "cron", "timezone", "pool", "tenant", "priority", "payload", "catch_up", "deadline", "max_retries",
)


def _broker_settings(s: _Section, base_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {
        "clients": s.get("clients", _endpoint, DEFAULT_CLIENTS),
        "workers": s.get("workers", _endpoint, DEFAULT_WORKERS),
        "durability": s.get("durability", _choice(DURABILITIES), "sync"),
        "metrics": s.get("metrics", _host_port, None),
        "dashboard": s.get("dashboard", _host_port, None),
        "dashboard_hosts": s.get("dashboard_hosts", _host_names, ()),
        "metrics_hosts": s.get("metrics_hosts", _host_names, ()),
        "heartbeat_interval": s.get("heartbeat_interval", _positive_number, 1.0),
        "liveness": s.get("liveness", _positive_int, 3),
        "max_payload_bytes": s.get("max_payload_bytes", _positive_int, 1048576),
        "max_deliveries": s.get("max_deliveries", _positive_int, 5),
        "result_ttl": s.get("result_ttl", _positive_number, 86400.0),
        "result_retention_bytes": s.get("result_retention_bytes", _positive_int, DEFAULT_RETENTION_BYTES),
        "results_store": s.get("results_store", _bool, True),
        "auth_timeout": s.get("auth_timeout", _positive_number, 5.0),
        "max_connections": s.get("max_connections", _positive_int, None),
        "connection_buffer_bytes": s.get("connection_buffer_bytes", _positive_int, 4 * 1048576),
    }
    if out["dashboard"] is not None and out["dashboard"] == out["metrics"]:
        raise s.error("dashboard", f"must differ from metrics ({out['metrics']!r}); each is a server of its own")
    if out["clients"] == out["workers"] and not _is_ephemeral(out["clients"]):
        raise s.error("workers", f"must differ from clients ({out['clients']!r}); give each socket its own endpoint")
    # data_dir is accepted with durability = "none" so that switching the
    # durability line on and off is all it takes; it then has no effect.
    data_dir = _resolve(base_dir, s.get("data_dir", _string, DEFAULT_DATA_DIR))
    out["data_dir"] = None if out["durability"] == "none" else data_dir
    key_file = s.get("curve_secret_key_file", _string, None)
    out["curve_secret_key_file"] = None if key_file is None else _resolve(base_dir, key_file)
    return out


def _cluster_settings(top: _Section, broker: _Section, base_dir: Path, override: str | None,
                      pools: tuple[PoolSettings, ...]) -> dict[str, Any]:
    """`member` and `cluster`, and in a cluster the defaults of this member's endpoints and data_dir.

    Without a `[cluster]` table nothing changes (and `member` keys are mistakes). In one, the endpoints not
    set in `[broker]` are the member's first addresses, and data_dir, when not set, is cronoq-data/MEMBER,
    so one file serves every member.
    """
    cluster_section = top.subsection("cluster", ("members",))
    named = broker.get("member", _member_name, None)
    pinned = {}
    for number, s in top.array_of_tables("pools", "[[pools]]", None):
        if "member" in s.table:
            pinned[s.table["name"]] = s.relabel(f"[[pools]] #{number} {s.table['name']!r}").get(
                "member", _member_name, None)
    if "cluster" not in top.table:
        if named is not None:
            raise broker.error("member", "names a cluster member, but the file has no [cluster] table; "
                                         "declare the members in [[cluster.members]] or remove the key")
        if override is not None:
            raise ConfigError(f"{top.source}: --member {override!r} given, but the file has no [cluster] table; "
                              "declare the members in [[cluster.members]]")
        if pinned:
            pool, _ = next(iter(pinned.items()))
            raise ConfigError(f"{top.source}: [[pools]] {pool!r} member: names a cluster member, but the file has "
                              "no [cluster] table; declare the members in [[cluster.members]] or remove the key")
        return {}
    members: list[Member] = []
    seen: dict[str, int] = {}
    for number, s in cluster_section.array_of_tables("members", "[[cluster.members]]", _MEMBER_KEYS):
        name = s.require("name", _member_name, "a member name such as 'b1'")
        s = s.relabel(f"[[cluster.members]] #{number} {name!r}")
        if name in seen:
            raise s.error("name", f"duplicate member name {name!r} (also #{seen[name]}); member names must be unique")
        seen[name] = number
        members.append(Member(
            name=name,
            clients=s.require("clients", _endpoints, "an endpoint, or a list of them (a primary, then standbys)"),
            workers=s.require("workers", _endpoints, "an endpoint, or a list of them (a primary, then standbys)"),
        ))
    if not members:
        raise cluster_section.error("members", "missing; list each broker of the cluster as a [[cluster.members]] "
                                               "table with name, clients and workers")
    names = [m.name for m in members]
    member = override if override is not None else named
    if member is None:
        raise broker.error("member", f"missing; with a [cluster] table, say which member this broker is "
                                     f"(one of {', '.join(names)}), or start it with --member NAME")
    if member not in names:
        where = "--member" if override is not None else None
        problem = f"no cluster member named {member!r}; members: {', '.join(names)}"
        if where:
            raise ConfigError(f"{top.source}: --member: {problem}")
        raise broker.error("member", problem)
    declared = {pool.name for pool in pools}
    for pool, owner in pinned.items():
        if owner not in names:
            raise ConfigError(f"{top.source}: [[pools]] {pool!r} member: no cluster member named {owner!r}; "
                              f"members: {', '.join(names)}")
        assert pool in declared
    cluster = Cluster(tuple(members), MappingProxyType(pinned))
    me = cluster.member(member)
    out: dict[str, Any] = {"member": member, "cluster": cluster}
    if "clients" not in broker.table:
        out["clients"] = me.clients[0]
    if "workers" not in broker.table:
        out["workers"] = me.workers[0]
    if "data_dir" not in broker.table and broker.get("durability", _choice(DURABILITIES), "sync") != "none":
        out["data_dir"] = _resolve(base_dir, os.path.join(DEFAULT_DATA_DIR, member))
    return out


def _pools(top: _Section) -> tuple[tuple[PoolSettings, ...], Mapping[str, PoolLimits]]:
    pools: list[PoolSettings] = []
    limits: dict[str, PoolLimits] = {}
    first_seen: dict[str, int] = {}
    for number, s in top.array_of_tables("pools", "[[pools]]", _POOL_KEYS):
        name = s.require("name", _pool_name, "a pool name such as 'llm'")
        s = s.relabel(f"[[pools]] #{number} {name!r}")
        if name in first_seen:
            raise s.error(None, f"duplicate pool name {name!r} (also #{first_seen[name]}); pool names must be unique")
        first_seen[name] = number
        settings = PoolSettings(
            name=name,
            tenant_weights=s.get("tenant_weights", _weights, {}),
            fair_share=s.get("fair_share", _bool, False),
            max_in_flight=s.get("max_in_flight", _positive_int, None),
            tenant_limits=s.get("tenant_limits", _tenant_limits, {}),
            default_weight=s.get("default_weight", _positive_number, None),
            default_tenant_limit=s.get("default_tenant_limit", _positive_int, None),
            share_by=s.get("share_by", _choice(SHARE_BY), "dispatches"),
            tenant_rates=s.get("tenant_rates", _rates, {}),
            tenant_minimums=s.get("tenant_minimums", _tenant_limits, {}),
        )
        _check_pool(s, settings)
        pools.append(settings)
        limits[name] = PoolLimits(
            max_backlog=s.get("max_backlog", _positive_int, None),
            max_tenant_backlog=s.get("max_tenant_backlog", _positive_int, None),
        )
    if not pools:
        return _default_pools(), _default_limits()
    return tuple(pools), MappingProxyType(limits)


def _check_pool(s: _Section, settings: PoolSettings) -> None:
    """What only the pool's keys together can tell: a minimum above a ceiling, minimums over max_in_flight.

    The core states these rules (check_settings); here they are placed at the key that breaks them.
    """
    try:
        check_settings(settings)
    except InvalidArgument as e:
        problem = str(e).removeprefix(f"pool {settings.name!r}: ")
        key = "tenant_minimums" if "minimum" in problem or "guaranteed" in problem else None
        raise s.error(key, problem) from None


def _tokens(top: _Section, environ: Mapping[str, str]) -> tuple[TokenSpec, ...]:
    auth = top.subsection("auth", ("tokens",))
    tokens: list[TokenSpec] = []
    owner_of: dict[bytes, tuple[int, str]] = {}
    for number, s in auth.array_of_tables("tokens", "[[auth.tokens]]", _TOKEN_KEYS):
        env = s.require("token_env", _env_name, "the name of an environment variable such as 'CRONOQ_TOKEN'")
        role = s.require("role", _choice(ROLES), "one of 'client', 'worker', 'admin', 'viewer'")
        tenant = s.get("tenant", _tenant, None)
        value = environ.get(env)
        if value is None:
            raise s.error("token_env", f"environment variable {env} is not set; export the token in it before starting")
        if not value:
            raise s.error("token_env", f"environment variable {env} is empty; it must hold the token")
        secret = value.encode("utf-8")
        if secret in owner_of:
            other, other_env = owner_of[secret]
            raise s.error(
                "token_env",
                f"environment variable {env} holds the same token as #{other} ({other_env}); "
                "each token must be distinct so it names one role and tenant",
            )
        owner_of[secret] = (number, env)
        tokens.append(TokenSpec(secret=secret, role=role, tenant=tenant, token_env=env))
    return tuple(tokens)


def _schedules(top: _Section, pool_names: set[str]) -> tuple[Schedule, ...]:
    schedules: list[Schedule] = []
    seen: set[str] = set()
    for _, s in top.array_of_tables("schedules", "[[schedules]]", _SCHEDULE_KEYS):
        name = s.require("name", _pool_name, "a schedule name such as 'nightly-report'")
        s = s.relabel(f"[[schedules]] {name!r}")
        if name in seen:
            raise s.error("name", f"duplicate schedule name {name!r}; schedule names must be unique")
        seen.add(name)
        pool = s.get("pool", _string, "default")
        if pool not in pool_names:
            raise s.error("pool", f"no pool named {pool!r}; declared pools: {', '.join(sorted(pool_names))}")
        try:
            schedule = Schedule(
                name=name,
                cron=s.require("cron", _string, "a cron expression such as '0 3 * * *'"),
                pool=pool,
                timezone=s.get("timezone", _string, "UTC"),
                tenant=s.get("tenant", _tenant, None),
                priority=s.get("priority", _choice(PRIORITIES), "normal"),
                payload=s.table.get("payload"),
                catch_up=s.get("catch_up", _bool, True),
                deadline=s.get("deadline", _positive_number, None),
                max_retries=s.get("max_retries", _non_negative_int, 0),
            )
        except ScheduleError as exc:
            raise s.error("cron" if "cron" in str(exc) else "timezone", str(exc)) from None
        schedules.append(schedule)
    return tuple(schedules)


# --- where a value sits, and how its errors read --------------------------------


class _Invalid(Exception):
    """A value's problem, before it is placed at a file and key."""


T = TypeVar("T")


class _Section:
    """One table of the file: its label for messages, its keys, typed access to its values."""

    def __init__(self, source: str, label: str, table: Mapping[str, Any], allowed: tuple[str, ...] | None) -> None:
        self.source, self.label, self.table = source, label, table
        if allowed is not None:
            for key in table:
                if key not in allowed:
                    raise self.error(key, _unknown_key(key, allowed))

    def relabel(self, label: str) -> _Section:
        return _Section(self.source, label, self.table, None)

    def error(self, key: str | None, problem: str) -> ConfigError:
        where = " ".join(part for part in (self.label, key) if part)
        return ConfigError(f"{self.source}: {where}: {problem}")

    def get(self, key: str, check: Callable[[Any], T], default: T) -> T:
        """The checked value of `key`, or `default` when the key is absent."""
        if key not in self.table:
            return default
        return self._checked(key, check)

    def require(self, key: str, check: Callable[[Any], T], expected: str) -> T:
        """The checked value of `key`, which must be present."""
        if key not in self.table:
            raise self.error(key, f"missing; expected {expected}")
        return self._checked(key, check)

    def _checked(self, key: str, check: Callable[[Any], T]) -> T:
        try:
            return check(self.table[key])
        except _Invalid as e:
            raise self.error(key, str(e)) from None

    def subsection(self, key: str, allowed: tuple[str, ...]) -> _Section:
        label = f"[{self._path(key)}]"
        value = self.table.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a table {label}, got {_show(value)}")
        return _Section(self.source, label, value, allowed)

    def array_of_tables(self, key: str, label: str, allowed: tuple[str, ...] | None) -> list[tuple[int, _Section]]:
        """Each table of the array `key`, numbered from 1 as the user counts them."""
        value = self.table.get(key, [])
        if not isinstance(value, list):
            raise self.error(key, f"expected an array of tables ({label}), got {_show(value)}")
        out = []
        for number, entry in enumerate(value, start=1):
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{self.source}: {label} #{number}: expected a table, got {_show(entry)}")
            out.append((number, _Section(self.source, f"{label} #{number}", entry, allowed)))
        return out

    def _path(self, key: str) -> str:
        return f"{self.label.strip('[]')}.{key}" if self.label else key


def _table(source: str, what: str, data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {what}: expected a table, got {_show(data)}")
    return data


def _unknown_key(key: str, allowed: tuple[str, ...]) -> str:
    hint = difflib.get_close_matches(key, allowed, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown key{did_you_mean}; allowed keys: {', '.join(sorted(allowed))}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _toml_problem(message: str, raw: bytes) -> str:
    m = _TOML_POSITION.match(message)
    if not m:
        return f"invalid TOML: {message}"
    problem = f"line {m['line']}, column {m['col']}: invalid TOML: {m['msg']}"
    lines = raw.decode("utf-8").splitlines()
    number = int(m["line"])
    line = lines[number - 1] if 0 < number <= len(lines) else ""
    bare = _BARE_TENANT_PATH.match(line)
    if bare:
        # TOML's bare keys cannot hold "/", so the parser stops at it and says only "Expected '='".
        path = bare["key"].strip()
        problem += f'; a tenant path is a quoted key: write "{path}" = ... instead of {path} = ...'
    return problem


def _resolve(base_dir: Path, path: str) -> Path:
    return Path(os.path.abspath(os.path.join(base_dir, os.path.expanduser(path))))


# --- value checks: return the value to keep, or raise _Invalid ------------------


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(f"expected a non-empty string, got {_show(value)}")
    return value


def _tenant(value: Any) -> str:
    """A tenant a token is pinned to or a schedule submits as: a name or a path, by the rules of submit."""
    value = _string(value)
    problem = tenant_problem(value)
    if problem is not None:
        raise _Invalid(problem)
    if len(value) > MAX_NAME_CHARS:
        raise _Invalid(f"a tenant has at most {MAX_NAME_CHARS} characters, got one of {len(value)}")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid(f"expected a whole number, 0 or more, got {_show(value)}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_show(value)}")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Invalid(f"expected a positive integer, got {_show(value)}")
    return value


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _Invalid(f"expected a positive number, got {_show(value)}")
    return float(value)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise _Invalid(f"expected one of {', '.join(map(repr, options))}, got {_show(value)}")
        return value

    return check


def _pool_name(value: Any) -> str:
    if not isinstance(value, str) or not _POOL_NAME.fullmatch(value):
        raise _Invalid(f"expected a non-empty string of letters, digits, '-', '_' or '.', got {_show(value)}")
    return value


def _member_name(value: Any) -> str:
    # A task id is the member's name, a colon and the rest: a name holds no colon.
    if not isinstance(value, str) or not _POOL_NAME.fullmatch(value):
        raise _Invalid(f"expected a member name of letters, digits, '-', '_' or '.' (e.g. 'b1'), got {_show(value)}")
    return value


def _endpoints(value: Any) -> tuple[str, ...]:
    """One endpoint, or a non-empty list of them (a member's primary first, then its standbys)."""
    if isinstance(value, str):
        return (_endpoint(value),)
    if not isinstance(value, list) or not value:
        raise _Invalid(f"expected an endpoint such as 'tcp://10.0.0.1:5555' or a non-empty list of them, "
                       f"got {_show(value)}")
    out = tuple(_endpoint(item) for item in value)
    if len(set(out)) != len(out):
        raise _Invalid(f"lists the same endpoint twice: {list(out)}")
    return out


def _env_name(value: Any) -> str:
    # Do not echo a malformed value: it may be the secret pasted in by mistake.
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise _Invalid(
            "expected the name of an environment variable (letters, digits and '_', "
            "e.g. 'CRONOQ_TOKEN'), not the token itself"
        )
    return value


def _weights(value: Any) -> dict[str, float]:
    return _per_tenant(value, "positive number", _positive_number)


def _rates(value: Any) -> dict[str, float]:
    return _per_tenant(value, "positive number of dispatches per second", _positive_number)


def _tenant_limits(value: Any) -> dict[str, int]:
    return _per_tenant(value, "positive integer", _positive_int)


def _per_tenant(value: Any, expected: str, check: Callable[[Any], T]) -> dict[str, T]:
    """A table of tenant node (a name or a path such as "acme/search") = value."""
    if not isinstance(value, Mapping):
        raise _Invalid(f'expected a table of tenant = {expected} (quote paths: "acme/search" = ...), got {_show(value)}')
    out = {}
    for tenant, item in value.items():
        if not tenant:
            raise _Invalid("tenant names must be non-empty")
        problem = tenant_problem(tenant)
        if problem is not None:
            raise _Invalid(problem)
        if isinstance(item, Mapping):
            raise _Invalid(
                f"tenant {tenant!r}: expected a {expected}, got a table; "
                f'a sub-tenant is a quoted path: "{tenant}/search" = ..., not {tenant}.search'
            )
        try:
            out[tenant] = check(item)
        except _Invalid as e:
            raise _Invalid(f"tenant {tenant!r}: {e}") from None
    return out


def _endpoint(value: Any) -> str:
    expected = "an endpoint such as 'tcp://127.0.0.1:5555', 'ipc:///run/cronoq.sock' or 'inproc://name'"
    if not isinstance(value, str) or not value.startswith(ENDPOINT_SCHEMES):
        raise _Invalid(f"expected {expected}, got {_show(value)}")
    scheme, _, rest = value.partition("://")
    if not rest:
        raise _Invalid(f"expected {expected}, got {_show(value)}")
    if scheme == "tcp":
        host, sep, port = rest.rpartition(":")
        # '*' and 0 ask the OS for a free port, as zmq allows.
        if not sep or not host or not (port == "*" or _port(port, allow_zero=True) is not None):
            raise _Invalid(f"expected tcp://HOST:PORT with PORT 0-65535 or '*', got {_show(value)}")
    return value


def _is_ephemeral(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and endpoint.rpartition(":")[2] in ("*", "0")


def _host_port(value: Any) -> str:
    if isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if sep and host and _port(port, allow_zero=False) is not None:
            return value
    raise _Invalid(f"expected 'HOST:PORT' with PORT 1-65535, e.g. '127.0.0.1:9464', got {_show(value)}")


# A DNS name (labels of letters, digits and '-', dots between) or an IP address; an IPv6 one in brackets with a port.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
MAX_HOST_NAMES = 64


def _host_names(value: Any) -> tuple[str, ...]:
    """The names the dashboard or the metrics answer to: a list of "NAME" or "NAME:PORT" (the Host header a
    browser or a scraper sends)."""
    expected = "a list of names such as 'cronoq.internal' or 'cronoq.internal:8080'"
    if not isinstance(value, list) or len(value) > MAX_HOST_NAMES:
        raise _Invalid(f"expected {expected} (at most {MAX_HOST_NAMES}), got {_show(value)}")
    out = []
    for item in value:
        if not isinstance(item, str):
            raise _Invalid(f"expected {expected}, got {_show(item)} in the list")
        name, port = item, None
        if item.startswith("["):
            name, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else (None if not rest else "")
            valid = bool(name) and ":" in name
        else:
            if item.count(":") == 1:
                name, _, port = item.partition(":")
            valid = _HOST_NAME.fullmatch(name) is not None
        if not valid or (port is not None and _port(port, allow_zero=False) is None):
            raise _Invalid(f"expected {expected}, got {_show(item)} in the list")
        out.append(item.lower())
    return tuple(out)


def _port(text: str, *, allow_zero: bool) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    port = int(text)
    return port if (0 if allow_zero else 1) <= port <= 65535 else None
