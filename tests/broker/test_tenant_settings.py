"""Tenant trees and ceilings in the settings: the config file's pools keys, cronoq.Pool, and the
check of a worker's explicit settings against the broker's."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import cronoq
from cronoq.broker.config import ConfigError, parse_config
from cronoq.core.settings import PoolSettings
from cronoq.pool import settings_disagreement

EXAMPLE = """
[[pools]]
name = "llm"
default_weight = 2
default_tenant_limit = 10
[pools.tenant_weights]
acme = 3
globex = 1
"acme/search" = 2
"acme/ads" = 1
[pools.tenant_limits]
acme = 20
"acme/search" = 5
"""


def parse(text: str):
    return parse_config(tomllib.loads(text), source="cronoq.toml", base_dir=Path("/tmp"), environ={})


def test_the_documented_tree_config_is_read_into_pool_settings():
    (llm,) = parse(EXAMPLE).pools
    assert llm == PoolSettings(
        "llm",
        tenant_weights={"acme": 3, "globex": 1, "acme/search": 2, "acme/ads": 1},
        tenant_limits={"acme": 20, "acme/search": 5},
        default_weight=2,
        default_tenant_limit=10,
    )
    assert llm.fair
    assert llm.weight("acme/search") == 2 and llm.weight("acme/search/alice") == 2 and llm.weight(None) == 1
    assert llm.limit("acme/search") == 5 and llm.limit("globex") == 10 and llm.limit("globex/x") is None


def test_ceilings_alone_make_a_pool_fair():
    (pool,) = parse('[[pools]]\nname = "p"\n[pools.tenant_limits]\nacme = 2\n').pools
    assert pool.fair and pool.tenant_weights == {}


@pytest.mark.parametrize(
    "pool, words",
    [
        ('[pools.tenant_limits]\nacme = 0', ["'p' tenant_limits", "'acme'", "positive integer"]),
        ('[pools.tenant_limits]\nacme = 2.5', ["'p' tenant_limits", "'acme'", "positive integer"]),
        ('[pools.tenant_limits]\nacme = true', ["'p' tenant_limits", "'acme'", "boolean"]),
        ('tenant_limits = 3', ["'p' tenant_limits", "table"]),
        ('[pools.tenant_limits]\n"acme//x" = 1', ["'p' tenant_limits", "'acme//x'", "empty segment"]),
        ('[pools.tenant_weights]\n"/acme" = 1', ["'p' tenant_weights", "'/acme'", "empty segment"]),
        ('[pools.tenant_weights]\n"a/b/c/d/e/f/g/h/i" = 1', ["'p' tenant_weights", "9 levels", "at most 8"]),
        ('[pools.tenant_weights]\nacme.search = 2', ["'p' tenant_weights", "quoted path", '"acme/search"']),
        ("default_weight = 0", ["'p' default_weight", "positive number"]),
        ("default_weight = 'x'", ["'p' default_weight", "'x'"]),
        ("default_tenant_limit = 0", ["'p' default_tenant_limit", "positive integer"]),
        ("default_tenant_limit = 1.5", ["'p' default_tenant_limit", "positive integer"]),
        ("tenant_limit = 1", ["tenant_limit", "unknown key", "tenant_limits"]),
    ],
)
def test_bad_tree_settings_are_config_errors_naming_the_key(pool, words):
    with pytest.raises(ConfigError) as caught:
        parse(f'[[pools]]\nname = "p"\n{pool}\n')
    for word in words:
        assert word in str(caught.value)


def test_pool_takes_tree_settings_and_refuses_bad_ones():
    pool = cronoq.Pool("llm", tenant_weights={"acme/search": 2}, tenant_limits={"acme": 3}, default_weight=0.5,
                       default_tenant_limit=9)
    assert pool.settings() == PoolSettings("llm", tenant_weights={"acme/search": 2}, tenant_limits={"acme": 3},
                                           default_weight=0.5, default_tenant_limit=9)
    assert pool.explicit_settings() == {
        "tenant_weights": {"acme/search": 2}, "tenant_limits": {"acme": 3}, "default_weight": 0.5,
        "default_tenant_limit": 9,
    }
    assert cronoq.Pool("x").explicit_settings() == {}
    for kwargs, words in [
        ({"tenant_limits": {"acme": 0}}, "limit of tenant 'acme'"),
        ({"tenant_limits": {"a//b": 1}}, "tenant_limits: tenant 'a//b' has an empty segment"),
        ({"tenant_weights": {"a/": 1}}, "tenant_weights: tenant 'a/'"),
        ({"default_weight": 0}, "default_weight"),
        ({"default_tenant_limit": True}, "default_tenant_limit"),
    ]:
        with pytest.raises(cronoq.InvalidArgument, match=words):
            cronoq.Pool("x", **kwargs)


def test_a_worker_s_tree_settings_must_agree_with_the_broker_s():
    configured = PoolSettings("llm", tenant_limits={"acme": 3}, default_weight=2.0)
    agree = cronoq.Pool("llm", tenant_limits={"acme": 3}, default_weight=2)
    assert settings_disagreement("llm", agree.explicit_settings(), configured) is None
    assert "tenant_limits" in settings_disagreement("llm", {"tenant_limits": {"acme": 4}}, configured)
    assert "default_weight = 3" in settings_disagreement("llm", {"default_weight": 3}, configured)
    assert "default_tenant_limit = 2 but the broker's config has unset" in settings_disagreement(
        "llm", {"default_tenant_limit": 2}, configured
    )
    assert "integers" in settings_disagreement("llm", {"tenant_limits": {"acme": "many"}}, configured)
