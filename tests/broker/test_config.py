"""Config loading and validation: the rules of docs/configuration.md, and failing closed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cronoq.broker.config import (
    BrokerConfig,
    ConfigError,
    PoolLimits,
    TokenSpec,
    default_config,
    load_config,
    parse_config,
)
from cronoq.broker.schedules import Schedule
from cronoq.core.settings import PoolSettings

# The documented example config (every key the broker must accept), verbatim.
CONTRACT_EXAMPLE = """\
[broker]
clients = "tcp://127.0.0.1:5555"   # ROUTER that clients submit to
workers = "tcp://127.0.0.1:5556"   # ROUTER that workers connect their DEALERs to
data_dir = "cronoq-data"           # durable state (this is the default); relative to the config file
# durability = "none"              # keep everything in memory instead
# metrics = "127.0.0.1:9464"       # serve Prometheus text format at /metrics
# heartbeat_interval = 1.0         # seconds between heartbeats, both ways
# liveness = 3                     # missed heartbeats before a worker is lost
# max_payload_bytes = 1048576      # larger payloads and results: INVALID_ARGUMENT

[[pools]]
name = "llm"
[pools.tenant_weights]             # implies fair sharing; tenants not listed weigh 1
acme = 3
globex = 1

[[pools]]
name = "batch"
fair_share = true                  # equal shares without listing weights
max_in_flight = 8                  # at most 8 tasks of this pool running at once, over all workers

[[auth.tokens]]
token_env = "CRONOQ_ACME_TOKEN"    # the secret is read from this environment variable at start-up
role = "client"                    # client | worker | admin
tenant = "acme"                    # optional: tasks from this token are acme's
"""

SECRET = "s3cret-acme-token-value"
ENV = {"CRONOQ_ACME_TOKEN": SECRET, "W": "worker-secret", "A": "admin-secret"}


def write(tmp_path: Path, text: str, name: str = "cronoq.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> BrokerConfig:
    return load_config(write(tmp_path, text), environ=ENV if environ is None else environ)


def config_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, environ)
    message = str(info.value)
    assert message.startswith(str(tmp_path / "cronoq.toml") + ": "), message
    assert SECRET not in message
    return message


# --- defaults and the contract's example --------------------------------------


def test_default_config_matches_the_contract(tmp_path: Path) -> None:
    c = default_config(tmp_path)
    assert c.source == "<defaults>"
    assert c.clients == "tcp://127.0.0.1:5555"
    assert c.workers == "tcp://127.0.0.1:5556"
    assert c.data_dir == tmp_path / "cronoq-data"
    assert c.durability == "sync"
    assert c.metrics is None
    assert (c.heartbeat_interval, c.liveness, c.max_payload_bytes) == (1.0, 3, 1048576)
    assert (c.max_deliveries, c.result_ttl, c.result_retention_bytes) == (5, 86400.0, 128 << 20)
    assert c.results_store is True
    assert c.pools == (PoolSettings("default"),)
    assert dict(c.limits) == {"default": PoolLimits(None, None)}
    assert c.tokens == () and not c.auth_enabled
    assert c.curve_secret_key_file is None and c.schedules == ()


def test_default_config_uses_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_config().data_dir == Path(os.getcwd()) / "cronoq-data"


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    c = load(tmp_path, "")
    assert c.source == str(tmp_path / "cronoq.toml")
    expected = default_config(tmp_path)
    assert c == BrokerConfig(**{**expected.__dict__, "source": c.source})


def test_contract_example_parses(tmp_path: Path) -> None:
    c = load(tmp_path, CONTRACT_EXAMPLE)
    assert c.clients == "tcp://127.0.0.1:5555"
    assert c.workers == "tcp://127.0.0.1:5556"
    assert c.data_dir == tmp_path / "cronoq-data"
    assert c.durability == "sync"
    assert [p.name for p in c.pools] == ["llm", "batch"]
    llm, batch = c.pools
    assert llm == PoolSettings("llm", tenant_weights={"acme": 3, "globex": 1})
    assert llm.fair and llm.weight("acme") == 3.0 and llm.weight("initech") == 1.0
    assert batch == PoolSettings("batch", fair_share=True, max_in_flight=8)
    assert dict(c.limits) == {"llm": PoolLimits(), "batch": PoolLimits()}
    assert c.tokens == (TokenSpec(secret=SECRET.encode(), role="client", tenant="acme", token_env="CRONOQ_ACME_TOKEN"),)
    assert c.auth_enabled
    assert SECRET not in repr(c)


def test_example_with_commented_lines_enabled(tmp_path: Path) -> None:
    text = CONTRACT_EXAMPLE.replace("# durability", "durability").replace("# metrics", "metrics")
    text = text.replace("# heartbeat_interval = 1.0", "heartbeat_interval = 0.5").replace("# liveness", "liveness")
    text = text.replace("# max_payload_bytes = 1048576", "max_payload_bytes = 4096")
    c = load(tmp_path, text)
    assert c.durability == "none" and c.data_dir is None
    assert c.metrics == "127.0.0.1:9464"
    assert (c.heartbeat_interval, c.liveness, c.max_payload_bytes) == (0.5, 3, 4096)


def test_all_extensions(tmp_path: Path) -> None:
    c = load(
        tmp_path,
        """
        [broker]
        clients = "ipc:///tmp/c.sock"
        workers = "inproc://workers"
        max_deliveries = 2
        result_ttl = 60
        result_retention_bytes = 1000000
        results_store = false
        heartbeat_interval = 2
        curve_secret_key_file = "keys/broker.key"
        [[pools]]
        name = "q.1-x_y"
        max_backlog = 100
        max_tenant_backlog = 10
        [[auth.tokens]]
        token_env = "W"
        role = "worker"
        [[auth.tokens]]
        token_env = "A"
        role = "admin"
        [[schedules]]
        name = "nightly"
        cron = "0 3 * * *"
        pool = "q.1-x_y"
        timezone = "Europe/Berlin"
        tenant = "acme"
        priority = "low"
        payload = {report = "daily"}
        catch_up = false
        deadline = 600
        max_retries = 2
        """,
    )
    assert (c.clients, c.workers) == ("ipc:///tmp/c.sock", "inproc://workers")
    assert c.max_deliveries == 2
    assert c.result_ttl == 60.0 and isinstance(c.result_ttl, float)
    assert c.result_retention_bytes == 1000000
    assert c.results_store is False
    assert c.heartbeat_interval == 2.0 and isinstance(c.heartbeat_interval, float)
    assert c.curve_secret_key_file == tmp_path / "keys" / "broker.key"
    assert c.pools == (PoolSettings("q.1-x_y"),)
    assert c.limits["q.1-x_y"] == PoolLimits(max_backlog=100, max_tenant_backlog=10)
    assert [(t.role, t.tenant, t.secret) for t in c.tokens] == [
        ("worker", None, b"worker-secret"),
        ("admin", None, b"admin-secret"),
    ]
    assert c.schedules == (Schedule(
        "nightly", "0 3 * * *", pool="q.1-x_y", timezone="Europe/Berlin", tenant="acme", priority="low",
        payload={"report": "daily"}, catch_up=False, deadline=600.0, max_retries=2,
    ),)


# --- paths ----------------------------------------------------------------------


def test_relative_data_dir_is_resolved_against_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    write(conf_dir, '[broker]\ndata_dir = "../var/state"\n')
    monkeypatch.chdir(tmp_path)
    c = load_config("etc/cronoq.toml", environ={})
    assert c.source == "etc/cronoq.toml"
    assert c.data_dir == tmp_path / "var" / "state"
    assert c.data_dir.is_absolute()


def test_file_in_working_directory_resolves_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "")
    monkeypatch.chdir(tmp_path)
    assert load_config("cronoq.toml", environ={}).data_dir == Path(os.getcwd()) / "cronoq-data"


def test_absolute_data_dir_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    assert load(tmp_path, f"[broker]\ndata_dir = {str(target)!r}\n").data_dir == target


def test_durability_none_means_no_data_dir(tmp_path: Path) -> None:
    assert load(tmp_path, '[broker]\ndurability = "none"\n').data_dir is None


def test_parse_config_takes_already_parsed_data(tmp_path: Path) -> None:
    c = parse_config(
        {"broker": {"data_dir": "d"}, "pools": [{"name": "p", "tenant_weights": {"a": 2.5}}]},
        source="inline",
        base_dir=tmp_path,
        environ={},
    )
    assert c.source == "inline" and c.data_dir == tmp_path / "d"
    assert c.pools[0].weight("a") == 2.5


# --- reading and TOML errors ----------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read: No such file or directory"):
        load_config(path, environ={})


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path, environ={})


def test_toml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    message = config_error(tmp_path, "[broker]\n\nliveness = = 3\n")
    assert "cronoq.toml: line 3, column 12: invalid TOML: " in message


def test_an_unquoted_tenant_path_is_told_to_quote_it(tmp_path: Path) -> None:
    message = config_error(tmp_path, '[[pools]]\nname = "llm"\n[pools.tenant_weights]\nacme = 3\nacme/search = 2\n')
    assert "cronoq.toml: line 5, column 5: invalid TOML: " in message
    assert 'a tenant path is a quoted key: write "acme/search" = ... instead of acme/search = ...' in message


def test_other_syntax_errors_get_no_tenant_path_hint(tmp_path: Path) -> None:
    assert "quoted key" not in config_error(tmp_path, "[broker]\n\nliveness = = 3\n")


def test_toml_duplicate_table(tmp_path: Path) -> None:
    assert "invalid TOML" in config_error(tmp_path, "[broker]\n[broker]\n")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.toml"
    path.write_bytes(b'[broker]\nclients = "\xff"\n')
    with pytest.raises(ConfigError, match=r"cronoq\.toml: invalid TOML: not UTF-8"):
        load_config(path, environ={})


# --- validation: every message names the file, the key and the problem ----------

CASES = [
    # (toml, words the message must contain)
    ("brokr = 1", ["brokr", "unknown key", "did you mean 'broker'", "auth, broker, cluster, pools, schedules"]),
    ("broker = 1", ["broker", "expected a table"]),
    ("[broker]\nclient = 'tcp://x:1'", ["[broker] client", "unknown key", "'clients'"]),
    ("[broker]\nclients = 5555", ["[broker] clients", "expected an endpoint", "5555"]),
    ("[broker]\nclients = 'http://x:1'", ["[broker] clients", "tcp://"]),
    ("[broker]\nworkers = 'tcp://'", ["[broker] workers"]),
    ("[broker]\nworkers = 'tcp://host'", ["[broker] workers", "HOST:PORT"]),
    ("[broker]\nworkers = 'tcp://host:70000'", ["[broker] workers", "0-65535"]),
    ("[broker]\nclients = 'tcp://h:1'\nworkers = 'tcp://h:1'", ["[broker] workers", "must differ from clients"]),
    ("[broker]\ndata_dir = 3", ["[broker] data_dir", "non-empty string"]),
    ("[broker]\ndata_dir = ''", ["[broker] data_dir", "non-empty string"]),
    ("[broker]\ndurability = 'fast'", ["[broker] durability", "'sync', 'none'", "'fast'"]),
    ("[broker]\nmetrics = '9464'", ["[broker] metrics", "HOST:PORT"]),
    ("[broker]\nmetrics = 'localhost:0'", ["[broker] metrics", "1-65535"]),
    ("[broker]\nheartbeat_interval = 0", ["[broker] heartbeat_interval", "positive number"]),
    ("[broker]\nheartbeat_interval = -1.5", ["[broker] heartbeat_interval", "positive number"]),
    ("[broker]\nheartbeat_interval = nan", ["[broker] heartbeat_interval", "positive number"]),
    ("[broker]\nheartbeat_interval = inf", ["[broker] heartbeat_interval", "positive number"]),
    ("[broker]\nheartbeat_interval = true", ["[broker] heartbeat_interval", "true (a boolean)"]),
    ("[broker]\nliveness = 'three'", ["[broker] liveness: expected a positive integer, got 'three'"]),
    ("[broker]\nliveness = true", ["[broker] liveness", "positive integer", "boolean"]),
    ("[broker]\nliveness = 3.0", ["[broker] liveness", "positive integer", "3.0"]),
    ("[broker]\nmax_payload_bytes = 0", ["[broker] max_payload_bytes", "positive integer"]),
    ("[broker]\nmax_deliveries = -1", ["[broker] max_deliveries", "positive integer"]),
    ("[broker]\nresult_ttl = false", ["[broker] result_ttl", "positive number"]),
    ("[broker]\nresult_retention_bytes = 0", ["[broker] result_retention_bytes", "positive integer"]),
    ("[broker]\nresult_retention_bytes = 1.5e8", ["[broker] result_retention_bytes", "positive integer"]),
    ("[broker]\nresults_store = 'no'", ["[broker] results_store", "true or false"]),
    ("[broker]\nresults_store = 0", ["[broker] results_store", "true or false"]),
    ("[broker]\nresult_retention_bytes = \"128MiB\"", ["[broker] result_retention_bytes", "positive integer"]),
    ("[broker]\ncurve_secret_key_file = 1", ["[broker] curve_secret_key_file", "string"]),
    ("[pools]\nname = 'x'", ["pools", "array of tables ([[pools]])"]),
    ("pools = [1]", ["[[pools]] #1", "expected a table"]),
    ("[[pools]]\nfair_share = true", ["[[pools]] #1 name", "missing"]),
    ("[[pools]]\nname = ''", ["[[pools]] #1 name", "letters, digits"]),
    ("[[pools]]\nname = 'a b'", ["[[pools]] #1 name", "'a b'"]),
    ("[[pools]]\nname = 7", ["[[pools]] #1 name", "7"]),
    ("[[pools]]\nname = 'a'\nweights = {}", ["[[pools]] #1 weights", "unknown key", "tenant_weights"]),
    ("[[pools]]\nname = 'a'\n[[pools]]\nname = 'batch'\n[[pools]]\nname = 'batch'",
     ["[[pools]] #3 'batch': duplicate pool name 'batch' (also #2)"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = 3", ["[[pools]] #1 'a' tenant_weights", "table"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {acme = 0}", ["'a' tenant_weights", "'acme'", "positive number"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {acme = -2}", ["'a' tenant_weights", "'acme'", "positive number"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {acme = 'x'}", ["'a' tenant_weights", "'acme'", "'x'"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {acme = true}", ["'a' tenant_weights", "'acme'", "boolean"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {acme = inf}", ["'a' tenant_weights", "'acme'", "positive number"]),
    ("[[pools]]\nname = 'a'\ntenant_weights = {'' = 1}", ["'a' tenant_weights", "non-empty"]),
    ("[[pools]]\nname = 'a'\nfair_share = 1", ["[[pools]] #1 'a' fair_share", "true or false"]),
    ("[[pools]]\nname = 'a'\nmax_in_flight = 0", ["[[pools]] #1 'a' max_in_flight", "positive integer"]),
    ("[[pools]]\nname = 'a'\nmax_in_flight = true", ["[[pools]] #1 'a' max_in_flight", "boolean"]),
    ("[[pools]]\nname = 'a'\nmax_backlog = 1.5", ["[[pools]] #1 'a' max_backlog", "positive integer"]),
    ("[[pools]]\nname = 'a'\nmax_tenant_backlog = 0", ["[[pools]] #1 'a' max_tenant_backlog", "positive integer"]),
    ("auth = 1", ["auth", "expected a table"]),
    ("[auth]\nusers = []", ["[auth] users", "unknown key", "tokens"]),
    ("[auth]\ntokens = {}", ["[auth] tokens", "array of tables"]),
    ("[[auth.tokens]]\nrole = 'client'", ["[[auth.tokens]] #1 token_env", "missing"]),
    ("[[auth.tokens]]\ntoken_env = 'CRONOQ_UNSET'\nrole = 'client'",
     ["[[auth.tokens]] #1 token_env: environment variable CRONOQ_UNSET is not set"]),
    ("[[auth.tokens]]\ntoken_env = 'EMPTY'\nrole = 'client'", ["[[auth.tokens]] #1 token_env", "EMPTY is empty"]),
    ("[[auth.tokens]]\ntoken_env = 3\nrole = 'client'", ["[[auth.tokens]] #1 token_env", "environment variable"]),
    ("[[auth.tokens]]\ntoken_env = 'W'", ["[[auth.tokens]] #1 role", "missing", "'client', 'worker', 'admin'"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'root'", ["[[auth.tokens]] #1 role", "'root'", "'admin'"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'worker'\ntenant = ''", ["[[auth.tokens]] #1 tenant", "non-empty"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'worker'\ntenant = 1", ["[[auth.tokens]] #1 tenant", "string"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'worker'\nsecret = 'x'", ["[[auth.tokens]] #1 secret", "unknown key"]),
    # A pinned tenant is a tenant path by the rules of submit: segments, at most 8 levels, 200 characters.
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'client'\ntenant = 'acme//search'",
     ["[[auth.tokens]] #1 tenant", "'acme//search' has an empty segment"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'client'\ntenant = 'acme/'", ["[[auth.tokens]] #1 tenant", "empty segment"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'client'\ntenant = '/acme'", ["[[auth.tokens]] #1 tenant", "empty segment"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'client'\ntenant = 'a/b/c/d/e/f/g/h/i'",
     ["[[auth.tokens]] #1 tenant", "has 9 levels; at most 8 are allowed"]),
    ("[[auth.tokens]]\ntoken_env = 'W'\nrole = 'client'\ntenant = '" + "a" * 201 + "'",
     ["[[auth.tokens]] #1 tenant", "at most 200 characters, got one of 201"]),
    (("[[auth.tokens]]\ntoken_env = 'CRONOQ_ACME_TOKEN'\nrole = 'client'\n"
      "[[auth.tokens]]\ntoken_env = 'SAME'\nrole = 'admin'"),
     ["[[auth.tokens]] #2 token_env", "SAME holds the same token as #1 (CRONOQ_ACME_TOKEN)"]),
    ("[schedules]\nname = 'x'", ["schedules", "array of tables"]),
    ("[[schedules]]\ncron = '* * * * *'", ["[[schedules]] #1 name", "missing"]),
    ("[[schedules]]\nname = 3", ["[[schedules]] #1 name", "string"]),
    ("[[schedules]]\nname = 'n'", ["[[schedules]] 'n' cron", "missing"]),
    ("[[schedules]]\nname = 'n'\ncron = '61 * * * *'", ["[[schedules]] 'n' cron", "not a valid cron expression"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * *'", ["[[schedules]] 'n' cron", "five-field"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\ntimezone = 'Mars/Base'", ["[[schedules]] 'n' timezone", "Mars/Base"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\npool = 'gone'", ["[[schedules]] 'n' pool", "no pool named 'gone'"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\ncatch_up = 1", ["[[schedules]] 'n' catch_up", "true or false"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\nwhen = 1", ["[[schedules]] #1 when", "unknown key"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\ntenant = 'acme//x'",
     ["[[schedules]] 'n' tenant", "'acme//x' has an empty segment"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\ntenant = 'a/b/c/d/e/f/g/h/i'",
     ["[[schedules]] 'n' tenant", "9 levels"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\ntenant = 3", ["[[schedules]] 'n' tenant", "string"]),
    ("[[schedules]]\nname = 'n'\ncron = '* * * * *'\n[[schedules]]\nname = 'n'\ncron = '* * * * *'",
     ["[[schedules]] 'n' name", "duplicate schedule name"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "words"), CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_invalid_config_is_refused(tmp_path: Path, text: str, words: list[str]) -> None:
    environ = {**ENV, "EMPTY": "", "SAME": SECRET}
    message = config_error(tmp_path, text + "\n", environ)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_secret_pasted_into_token_env_is_not_echoed(tmp_path: Path) -> None:
    message = config_error(tmp_path, f"[[auth.tokens]]\ntoken_env = {SECRET!r}\nrole = 'client'\n")
    assert "token_env" in message and "not the token itself" in message


def test_ephemeral_tcp_ports_may_repeat(tmp_path: Path) -> None:
    c = load(tmp_path, "[broker]\nclients = 'tcp://127.0.0.1:*'\nworkers = 'tcp://127.0.0.1:*'\n")
    assert c.clients == c.workers == "tcp://127.0.0.1:*"


def test_ipv6_endpoint_and_metrics(tmp_path: Path) -> None:
    c = load(tmp_path, "[broker]\nclients = 'tcp://[::1]:5555'\nmetrics = '[::1]:9464'\n")
    assert c.clients == "tcp://[::1]:5555" and c.metrics == "[::1]:9464"


def test_environment_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONOQ_TEST_TOKEN", "from-os")
    path = write(tmp_path, "[[auth.tokens]]\ntoken_env = 'CRONOQ_TEST_TOKEN'\nrole = 'admin'\n")
    assert load_config(path).tokens[0].secret == b"from-os"


def test_empty_pool_array_means_default_pool(tmp_path: Path) -> None:
    c = load(tmp_path, "pools = []\n")
    assert c.pools == (PoolSettings("default"),) and set(c.limits) == {"default"}


def test_declared_pools_replace_default(tmp_path: Path) -> None:
    c = load(tmp_path, "[[pools]]\nname = 'llm'\n")
    assert [p.name for p in c.pools] == ["llm"] and set(c.limits) == {"llm"}


def test_config_is_immutable(tmp_path: Path) -> None:
    c = load(tmp_path, CONTRACT_EXAMPLE)
    with pytest.raises(AttributeError):
        c.liveness = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.limits["x"] = PoolLimits()  # type: ignore[index]


def test_token_and_schedule_tenants_may_be_paths(tmp_path: Path) -> None:
    text = (
        "[[auth.tokens]]\ntoken_env = 'CRONOQ_ACME_TOKEN'\nrole = 'client'\ntenant = 'acme/search/alice'\n"
        "[[schedules]]\nname = 'n'\ncron = '* * * * *'\ntenant = 'a/b/c/d/e/f/g/h'\n"
    )
    c = load(tmp_path, text)
    assert c.tokens[0].tenant == "acme/search/alice" and c.schedules[0].tenant == "a/b/c/d/e/f/g/h"
