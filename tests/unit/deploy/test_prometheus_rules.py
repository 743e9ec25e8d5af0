"""deploy/prometheus: promtool accepts the rules and their unit tests pass (deploy/prometheus/tests);
every rule reads metrics the server documents (docs/operations.md), Triton's or the cluster's, and
says how bad it is and what to do. tests/server/test_prometheus.py runs them in a real Prometheus."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from unit.deploy import promql

from specdec.config import REPO_ROOT

INSTALL = "./run's setup installs Debian's prometheus package (apt-get install prometheus)"
TESTS = sorted((REPO_ROOT / "deploy" / "prometheus" / "tests").glob("*.yaml"))
# what else rules may read: Prometheus's `up`, Triton's own metrics, kube-state-metrics'
OTHER_METRICS = {"up"}
OTHER_PREFIXES = ("nv_", "kube_deployment_", "kube_pod_container_")


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail(f"no `promtool` on PATH: {INSTALL}")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def test_promtool_accepts_the_rules():
    done = promtool("check", "rules", str(promql.RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_unit_tests_pass():
    assert TESTS
    done = promtool("test", "rules", *map(str, TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested():
    tested = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested |= {test["alertname"] for test in case.get("alert_rule_test", []) if test.get("exp_alerts")}
    assert tested == {rule["alert"] for rule in promql.rules() if "alert" in rule}


def test_rules_read_known_metrics_and_say_what_to_do():
    documented = promql.documented_metrics()
    recorded = {rule["record"] for rule in promql.rules() if "record" in rule}
    for rule in promql.rules():
        name = rule.get("record") or rule["alert"]
        for metric in promql.metric_names(rule["expr"]):
            assert metric in documented | recorded | OTHER_METRICS or metric.startswith(OTHER_PREFIXES), (name, metric)
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical"), name
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
