"""share_by, tenant rates and minimums in the settings: the config file's pool keys, cronoq.Pool, and the check
of a worker's explicit settings against the broker's."""

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
name = "gpu"
share_by = "runtime"
max_in_flight = 16
[pools.tenant_weights]
acme = 3
globex = 1
[pools.tenant_rates]
globex = 5
"acme/trial" = 0.5
[pools.tenant_minimums]
globex = 2
"""


def parse(text: str):
    return parse_config(tomllib.loads(text), source="cronoq.toml", base_dir=Path("/tmp"), environ={})


def test_the_documented_share_config_is_read_into_pool_settings():
    (gpu,) = parse(EXAMPLE).pools
    assert gpu == PoolSettings(
        "gpu", tenant_weights={"acme": 3, "globex": 1}, max_in_flight=16, share_by="runtime",
        tenant_rates={"globex": 5.0, "acme/trial": 0.5}, tenant_minimums={"globex": 2},
    )
    assert gpu.share_unit == "seconds"


@pytest.mark.parametrize("key", ['share_by = "cost"', '[pools.tenant_rates]\nacme = 2',
                                 '[pools.tenant_minimums]\nacme = 1'])
def test_each_new_key_alone_makes_a_pool_fair(key):
    (pool,) = parse(f'[[pools]]\nname = "p"\n{key}\n').pools
    assert pool.fair


@pytest.mark.parametrize(
    "pool, words",
    [
        ('share_by = "time"', ["'p' share_by", "'dispatches', 'cost', 'runtime'", "'time'"]),
        ('share_by = 1', ["'p' share_by", "'dispatches'"]),
        ('[pools.tenant_rates]\nacme = 0', ["'p' tenant_rates", "'acme'", "positive number"]),
        ('[pools.tenant_rates]\nacme = "fast"', ["'p' tenant_rates", "'acme'", "positive number"]),
        ('[pools.tenant_rates]\n"acme//x" = 1', ["'p' tenant_rates"]),
        ('[pools.tenant_minimums]\nacme = 1.5', ["'p' tenant_minimums", "'acme'", "positive integer"]),
        ('[pools.tenant_minimums]\nacme = 0', ["'p' tenant_minimums", "'acme'", "positive integer"]),
        ('max_in_flight = 3\n[pools.tenant_minimums]\nacme = 2\nglobex = 2',
         ["'p' tenant_minimums", "guarantee 4", "max_in_flight is 3"]),
        ('[pools.tenant_limits]\nacme = 1\n[pools.tenant_minimums]\n"acme/x" = 2',
         ["'p' tenant_minimums", "'acme/x'", "ceiling of 'acme'"]),
    ],
)
def test_bad_share_settings_are_config_errors_naming_file_and_key(pool, words):
    with pytest.raises(ConfigError) as e:
        parse(f'[[pools]]\nname = "p"\n{pool}\n')
    message = str(e.value)
    assert message.startswith("cronoq.toml: [[pools]] #1 'p'")
    for word in words:
        assert word in message, message


def test_nested_minimums_count_once_against_max_in_flight():
    (pool,) = parse('[[pools]]\nname = "p"\nmax_in_flight = 3\n[pools.tenant_minimums]\n'
                    'acme = 3\n"acme/search" = 2\n').pools
    assert pool.tenant_minimums == {"acme": 3, "acme/search": 2}


def test_pool_takes_share_settings_and_refuses_bad_ones():
    pool = cronoq.Pool("gpu", share_by="cost", tenant_rates={"acme": 5}, tenant_minimums={"globex": 2})
    assert pool.settings() == PoolSettings("gpu", share_by="cost", tenant_rates={"acme": 5.0},
                                           tenant_minimums={"globex": 2})
    assert pool.explicit_settings() == {"share_by": "cost", "tenant_rates": {"acme": 5.0},
                                        "tenant_minimums": {"globex": 2}}
    assert cronoq.Pool("p").explicit_settings() == {}
    assert cronoq.Pool("p").settings().share_by == "dispatches"
    for kwargs, words in [
        ({"share_by": "time"}, ["share_by", "'runtime'", "'time'"]),
        ({"tenant_rates": {"acme": 0}}, ["rate of tenant 'acme'", "positive"]),
        ({"tenant_rates": {"acme": float("inf")}}, ["rate of tenant 'acme'"]),
        ({"tenant_rates": {"/x": 1}}, ["tenant_rates"]),
        ({"tenant_minimums": {"acme": 1.0}}, ["minimum of tenant 'acme'", "positive integer"]),
        ({"tenant_minimums": {"acme": 3}, "max_in_flight": 2}, ["guarantee 3", "max_in_flight is 2"]),
    ]:
        with pytest.raises(cronoq.InvalidArgument) as e:
            cronoq.Pool("p", **kwargs)
        for word in words:
            assert word in str(e.value), str(e.value)


def test_a_worker_s_share_settings_must_agree_with_the_broker_s():
    (gpu,) = parse(EXAMPLE).pools
    mine = cronoq.Pool("gpu", share_by="runtime", tenant_rates={"globex": 5, "acme/trial": 0.5},
                       tenant_minimums={"globex": 2}, tenant_weights={"acme": 3, "globex": 1}, max_in_flight=16)
    assert settings_disagreement("gpu", mine.explicit_settings(), gpu) is None
    assert settings_disagreement("gpu", {}, gpu) is None
    problem = settings_disagreement("gpu", {"share_by": "cost"}, gpu)
    assert problem is not None and "share_by = 'cost'" in problem and "'runtime'" in problem
    problem = settings_disagreement("gpu", {"tenant_rates": {"globex": 6}}, gpu)
    assert problem is not None and "tenant_rates" in problem
    problem = settings_disagreement("gpu", {"tenant_minimums": {"globex": 3}}, gpu)
    assert problem is not None and "tenant_minimums" in problem
    assert "tenant_rates must map" in settings_disagreement("gpu", {"tenant_rates": ["x"]}, gpu)
