"""The `[cluster]` table, `[broker] member`, `--member` and a pool's `member` key: what they mean and how a
mistake in them is reported (file, key, what is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronoq.broker.config import ConfigError, load_config

CLUSTER = """
[cluster]
[[cluster.members]]
name = "b1"
clients = "tcp://10.0.0.1:5555"
workers = "tcp://10.0.0.1:5556"
[[cluster.members]]
name = "b2"
clients = ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]
workers = ["tcp://10.0.0.2:5556", "tcp://10.0.0.3:5556"]
"""

POOLS = """
[[pools]]
name = "llm"
member = "b2"
[[pools]]
name = "batch"
member = "b1"
[[pools]]
name = "hashed"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cronoq.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, member: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={}, member=member)
    return str(info.value)


def test_a_member_takes_its_addresses_data_dir_and_pools_from_the_shared_table(tmp_path: Path) -> None:
    text = '[broker]\nmember = "b2"\n' + CLUSTER + POOLS
    config = load_config(write(tmp_path, text), environ={})
    assert config.member == "b2"
    assert config.clients == "tcp://10.0.0.2:5555" and config.workers == "tcp://10.0.0.2:5556"
    assert config.data_dir == tmp_path / "cronoq-data" / "b2"
    assert config.cluster is not None and config.cluster.names == ["b1", "b2"]
    assert config.cluster.member("b2").clients == ("tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555")
    owned = {pool.name for pool in config.owned_pools}
    assert "llm" in owned and "batch" not in owned
    assert [pool.name for pool in config.pools] == ["llm", "batch", "hashed"]  # every member declares all


def test_member_on_the_command_line_overrides_the_file_and_broker_keys_override_the_table(tmp_path: Path) -> None:
    text = ('[broker]\nmember = "b2"\nclients = "tcp://0.0.0.0:7000"\ndata_dir = "here"\n' + CLUSTER + POOLS)
    config = load_config(write(tmp_path, text), environ={}, member="b1")
    assert config.member == "b1"
    assert config.clients == "tcp://0.0.0.0:7000" and config.workers == "tcp://10.0.0.1:5556"
    assert config.data_dir == tmp_path / "here"


def test_a_lone_broker_is_untouched(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[[pools]]\nname = 'llm'\n"), environ={})
    assert config.member is None and config.cluster is None
    assert config.owned_pools == config.pools and config.data_dir == tmp_path / "cronoq-data"


def test_every_declared_pool_has_exactly_one_owner(tmp_path: Path) -> None:
    text = CLUSTER + POOLS
    owners = {}
    for member in ("b1", "b2"):
        config = load_config(write(tmp_path, text), environ={}, member=member)
        for pool in config.owned_pools:
            assert pool.name not in owners
            owners[pool.name] = member
    assert owners["llm"] == "b2" and owners["batch"] == "b1" and set(owners) == {"llm", "batch", "hashed"}


MISTAKES = [
    ('[broker]\nmember = "b1"\n', None, ["[broker] member", "no [cluster] table"]),
    ("[[pools]]\nname = 'x'\nmember = 'b1'\n", None, ["'x' member", "no [cluster] table"]),
    ("", "b1", ["--member 'b1'", "no [cluster] table"]),
    (CLUSTER, None, ["[broker] member", "missing", "b1, b2", "--member"]),
    ('[broker]\nmember = "b9"\n' + CLUSTER, None, ["[broker] member", "no cluster member named 'b9'", "b1, b2"]),
    (CLUSTER, "b9", ["--member", "no cluster member named 'b9'"]),
    (CLUSTER + "[[pools]]\nname = 'x'\nmember = 'b7'\n", "b1", ["'x' member", "no cluster member named 'b7'"]),
    (CLUSTER + "[[pools]]\nname = 'x'\nmember = 3\n", "b1", ["'x' member", "member name"]),
    ("[cluster]\n", "b1", ["[cluster] members", "missing"]),
    ("[cluster]\nsize = 3\n", "b1", ["[cluster] size", "unknown key"]),
    (CLUSTER + '[[cluster.members]]\nname = "b1"\nclients = "tcp://h:1"\nworkers = "tcp://h:2"\n', "b1",
     ["[[cluster.members]] #3 'b1' name", "duplicate member name 'b1'"]),
    ('[cluster]\n[[cluster.members]]\nname = "a:b"\nclients = "tcp://h:1"\nworkers = "tcp://h:2"\n', "a:b",
     ["[[cluster.members]] #1 name", "member name"]),
    ('[cluster]\n[[cluster.members]]\nname = "b1"\nworkers = "tcp://h:2"\n', "b1",
     ["[[cluster.members]] #1 'b1' clients", "missing"]),
    ('[cluster]\n[[cluster.members]]\nname = "b1"\nclients = []\nworkers = "tcp://h:2"\n', "b1",
     ["'b1' clients", "non-empty list"]),
    ('[cluster]\n[[cluster.members]]\nname = "b1"\nclients = "http://h:1"\nworkers = "tcp://h:2"\n', "b1",
     ["'b1' clients", "endpoint"]),
    ('[cluster]\n[[cluster.members]]\nname = "b1"\nclients = ["tcp://h:1", "tcp://h:1"]\nworkers = "tcp://h:2"\n',
     "b1", ["'b1' clients", "same endpoint twice"]),
    ('[cluster]\n[[cluster.members]]\nname = "b1"\nclients = "tcp://h:1"\nworkers = "tcp://h:2"\nhost = "h"\n',
     "b1", ["[[cluster.members]] #1 host", "unknown key"]),
]


@pytest.mark.parametrize(("text", "member", "words"), MISTAKES, ids=[f"case{i}" for i in range(len(MISTAKES))])
def test_a_cluster_mistake_names_the_file_the_key_and_the_problem(tmp_path: Path, text: str, member: str | None,
                                                                  words: list[str]) -> None:
    message = error_of(tmp_path, text, member)
    assert message.startswith(str(tmp_path / "cronoq.toml"))
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
