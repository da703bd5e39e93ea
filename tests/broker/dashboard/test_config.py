"""The dashboard's config key and the viewer role: validation, and what a viewer may do."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronoq.broker.auth import Principal
from cronoq.broker.config import ConfigError, parse_config, tomllib
from cronoq.broker.hosts import host_problem, origin_problem
from cronoq.errors import PermissionDenied


def parse(text: str, environ: dict[str, str] | None = None):
    return parse_config(tomllib.loads(text), source="c.toml", base_dir=Path("/tmp"), environ=environ or {})


def test_the_dashboard_key_takes_a_host_and_port_and_is_off_by_default():
    assert parse("").dashboard is None
    assert parse('[broker]\ndashboard = "127.0.0.1:9465"\n').dashboard == "127.0.0.1:9465"
    with pytest.raises(ConfigError, match=r"c.toml: \[broker\] dashboard: expected 'HOST:PORT'"):
        parse('[broker]\ndashboard = "9465"\n')
    with pytest.raises(ConfigError, match="dashboard: must differ from metrics"):
        parse('[broker]\ndashboard = "127.0.0.1:9464"\nmetrics = "127.0.0.1:9464"\n')


@pytest.mark.parametrize("key", ["dashboard_hosts", "metrics_hosts"])
def test_the_names_the_dashboard_and_the_metrics_answer_to_are_names_with_or_without_a_port(key):
    assert getattr(parse(""), key) == ()
    config = parse(f'[broker]\n{key} = ["Cronoq.Example.com", "proxy:8443", "[::1]:9465", "10.0.0.5"]\n')
    assert getattr(config, key) == ("cronoq.example.com", "proxy:8443", "[::1]:9465", "10.0.0.5")
    for bad in ('"cronoq.example.com"', '["http://cronoq.example.com"]', '["a b"]', '["x:0"]', '[1]',
                "[" + ", ".join(['"a"'] * 65) + "]"):
        with pytest.raises(ConfigError, match=rf"c.toml: \[broker\] {key}: expected a list of names"):
            parse(f"[broker]\n{key} = {bad}\n")


def test_the_names_a_request_may_give_the_dashboard():
    configured = ["cronoq.internal:8080", "proxy.example"]
    for host in ("127.0.0.1:9465", "[::1]:1", "10.1.2.3", "localhost:8000", "LOCALHOST.", "broker1:9465",
                 "cronoq.internal:8080", "proxy.example", "proxy.example:443"):
        assert host_problem(host, "broker1", configured) is None, host
    assert host_problem(None, "broker1", configured) is None  # HTTP/1.0 without Host: no browser
    for host in ("evil.example:9465", "cronoq.internal", "cronoq.internal:8081", "", "a:b:c", "x" * 5000):
        problem = host_problem(host, "broker1", configured)
        assert problem is not None and "dashboard_hosts" in problem and len(problem) < 600, host
    assert origin_problem(None, None, []) is None
    assert origin_problem("http://127.0.0.1:9465", None, []) is None
    assert origin_problem("https://proxy.example", None, configured) is None
    for origin in ("null", "http://evil.example:9465", "https://cronoq.internal", "ftp://127.0.0.1",
                   "http://localhost:9465/path"):
        assert origin_problem(origin, None, configured) is not None, origin


def test_a_viewer_token_is_accepted_and_may_be_pinned_to_a_tenant():
    config = parse('[[auth.tokens]]\ntoken_env = "V"\nrole = "viewer"\n', {"V": "viewer-secret"})
    assert config.tokens[0].role == "viewer" and config.tokens[0].tenant is None
    # Pinned, it sees that tenant's subtree only (the dashboard and `stats` hold the pin).
    pinned = parse('[[auth.tokens]]\ntoken_env = "V"\nrole = "viewer"\ntenant = "acme"\n', {"V": "viewer-secret"})
    assert pinned.tokens[0].tenant == "acme"
    with pytest.raises(ConfigError, match="one of 'client', 'worker', 'admin', 'viewer'"):
        parse('[[auth.tokens]]\ntoken_env = "V"\nrole = "reader"\n', {"V": "viewer-secret"})


@pytest.mark.parametrize("action", ["stats", "status", "ping", "dashboard"])
def test_a_viewer_may_look(action):
    Principal("viewer").require(action)


@pytest.mark.parametrize("action", ["submit", "wait", "cancel", "pause", "resume", "reload", "serve"])
def test_a_viewer_may_change_nothing_nor_read_results(action):
    with pytest.raises(PermissionDenied, match="a viewer token may not"):
        Principal("viewer").require(action)


def test_refusals_name_every_role_that_may():
    with pytest.raises(PermissionDenied, match="that takes a client, viewer or admin token"):
        Principal("worker").require("status")
    with pytest.raises(PermissionDenied, match="that takes a viewer or admin token"):
        Principal("client").require("dashboard")
