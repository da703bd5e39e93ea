"""deploy/: the Grafana board and the Prometheus alert rules query only metrics a live broker really serves, and
the rules are valid (with `promtool check rules` and `promtool test rules` where promtool is installed, Debian's
`prometheus` package; by reading them otherwise)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import cronoq
from tests.support import ROOT, free_port, start_worker_process

DEPLOY = ROOT / "deploy"
BOARD = DEPLOY / "grafana" / "cronoq.json"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
METRIC = re.compile(r"\bcronoq_[a-z0-9_]+\b")
ALERTS = {"CronoqPoolHasNoWorkers", "CronoqTenantLaggingItsShare", "CronoqTaskFailuresHigh", "CronoqJournalCommitSlow"}


def board_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from board_panels(panel.get("panels", []))


def board_queries() -> list[str]:
    board = json.loads(BOARD.read_text())
    queries = [target["expr"] for panel in board_panels(board["panels"]) for target in panel.get("targets", [])]
    queries += [variable["definition"] for variable in board["templating"]["list"] if variable["type"] == "query"]
    return queries


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_the_board_is_a_grafana_dashboard_with_a_query_in_every_panel():
    board = json.loads(BOARD.read_text())
    assert board["uid"] == "cronoq-broker" and board["title"] == "cronoq" and board["schemaVersion"] >= 36
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "instance", "pool"}
    panels = list(board_panels(board["panels"]))
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["title"] and set(panel["gridPos"]) == {"h", "w", "x", "y"}
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and all(target["expr"] for target in panel["targets"])
    titles = " ".join(panel["title"] for panel in panels).lower()
    for topic in ("throughput", "queue depth", "share", "weighted share", "lag", "workers", "fail", "journal commit"):
        assert topic in titles, f"the board has no panel about {topic}"


def test_the_alert_rules_are_the_four_kinds_and_well_formed():
    found = rules()
    assert {rule["alert"] for rule in found} == ALERTS
    for rule in found:
        assert rule["expr"].strip() and re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert {case_rule["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
            for case_rule in case["alert_rule_test"]} == ALERTS


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_accepts_the_rules_and_each_alert_fires_when_it_should():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                          timeout=60, cwd=RULE_TESTS.parent)
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_metric_the_board_and_the_rules_query_is_served(broker_factory, tmp_path):
    port = free_port()
    broker = broker_factory('[[pools]]\nname = "llm"\nfair_share = true\n\n[[pools]]\nname = "failing"\n',
                            broker_extra=f'metrics = "127.0.0.1:{port}"')
    worker = start_worker_process(broker.workers, "tests.apps.dashboard:pools", tmp_path / "worker.log", cwd=ROOT)
    try:
        with cronoq.connect_sync(broker.clients) as client:
            assert client.submit(1, pool="llm", tenant="acme").result(timeout=30) == 1
            with pytest.raises(cronoq.TaskFailed):
                client.submit("x", pool="failing", tenant="acme").result(timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        worker.terminate()
        worker.wait(10)
    served = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    queried = {name for query in board_queries() + [rule["expr"] for rule in rules()] for name in METRIC.findall(query)}
    assert queried, "no metric found in the board and the rules"
    assert queried <= served, f"queried but not served: {sorted(queried - served)}"
