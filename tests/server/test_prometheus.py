"""deploy/prometheus's rules and deploy/grafana's dashboard against a real Prometheus (Debian's
binary, on 127.0.0.1) scraping the real server every second: after a short bench of prompt lookup
and the baseline, every dashboard query and every recording rule answers with a value, every rule
evaluates without error, every metric an alert reads is one the server exports, and the
prometheus-adapter's queries answer. What this server cannot have (a GPU's metrics, Kubernetes')
is named below with why."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support.servers import wait_for
from unit.deploy import promql

from specdec.cli import main
from specdec.triton.serve import free_port, terminate

pytestmark = pytest.mark.server

INSTALL = "./run's setup installs Debian's prometheus package (apt-get install prometheus)"
JOB = "specdec"  # the scrape job; in a cluster, the Service's name (the ServiceMonitor's job)

# Dashboard queries this server cannot answer, by (panel, refId): they must read only such metrics.
ELSEWHERE = {
    ("GPU utilization", "A"): "nv_gpu_* exist on a GPU only",
    ("GPU memory", "A"): "nv_gpu_* exist on a GPU only",
    ("GPU memory", "B"): "nv_gpu_* exist on a GPU only",
    ("Memory", "B"): "container_* are the kubelet's (cAdvisor), in Kubernetes",
    ("Scrapes and restarts", "C"): "kube_* are kube-state-metrics', in Kubernetes",
}
ELSEWHERE_METRICS = re.compile(r"^(nv_gpu_|container_|kube_)")
# Metrics alerts read that this server does not export, each with why.
NOT_EXPORTED_HERE = {
    "specdec_proposer_fallbacks_total": "a series appears with a draft model's first failure",
    "kube_deployment_status_replicas_unavailable": "kube-state-metrics, in Kubernetes",
    "kube_pod_container_status_restarts_total": "kube-state-metrics, in Kubernetes",
}


@dataclass
class Prometheus:
    url: str
    log: Path

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:  # a bad query: 400 with Prometheus's error
            body = json.loads(err.read())
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(f"no `prometheus` on PATH: {INSTALL}")
    work = tmp_path_factory.mktemp("prometheus")
    target = urllib.parse.urlsplit(server.metrics_url)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(promql.RULES)],
        "scrape_configs": [
            {"job_name": JOB, "metrics_path": target.path, "static_configs": [{"targets": [target.netloc]}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = Prometheus(f"http://127.0.0.1:{free_port()}", work / "prometheus.log")
    argv = [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address={urllib.parse.urlsplit(prom.url).netloc}"]  # fmt: skip
    with open(prom.log, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = wait_for(lambda: prom.ready() or process.poll() is not None, timeout=60, interval=0.2)
        assert started and process.poll() is None, f"Prometheus did not start:\n{prom.log.read_text()[-3000:]}"
        yield prom
    finally:
        terminate(process, timeout=15)


def _finished_requests(metrics: str) -> float:
    lines = [line for line in metrics.splitlines() if line.startswith("specdec_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


@pytest.fixture(scope="module")
def traffic(server, prometheus, tmp_path_factory):
    """Two short benches (prompt lookup and the baseline), each waited on until Prometheus has
    scraped what it finished: a rate needs two samples of a series with an increase between them,
    and a series is born with its first request, so one bench can leave every series with a single
    value (scrapes that time out while the bench holds both cores see nothing in between)."""
    for _ in range(2):
        argv = ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url,
                "--server-pid", str(server.process.pid), "--arms", "baseline,ngram:4", "--concurrency", "2",
                "--num-requests", "4", "--warmup", "0", "--max-tokens", "16", "--workload", "grounded",
                "--no-plots", "--output-dir", str(tmp_path_factory.mktemp("bench"))]  # fmt: skip
        assert main(argv) == 0
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            finished = _finished_requests(response.read().decode())

        def scraped(finished: float = finished) -> bool:
            result = prometheus.query(f'sum(specdec_requests_total{{job="{JOB}"}})')
            return bool(result) and float(result[0]["value"][1]) >= finished

        assert wait_for(scraped, timeout=30, interval=0.5), "Prometheus did not scrape the bench's requests"
    time.sleep(3)  # a few more rule evaluations after the last scrape


def _answers(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def test_every_dashboard_query_answers(prometheus, traffic):
    values = promql.dashboard_values(JOB)
    targets = {(panel, ref): expr for panel, ref, expr in promql.dashboard_targets()}
    assert set(ELSEWHERE) <= set(targets), "an exemption names a query the dashboard no longer has"
    silent = []
    for (panel, ref), expr in targets.items():
        result = prometheus.query(promql.fill(expr, values))  # fails on a query Prometheus refuses
        if (panel, ref) in ELSEWHERE:
            assert all(ELSEWHERE_METRICS.match(name) for name in promql.metric_names(expr)), (panel, ref, expr)
        elif not _answers(result):
            silent.append(f"{panel} [{ref}]: {expr} -> {result}")
    assert not silent, "dashboard queries without a value:\n" + "\n".join(silent)


def test_the_dashboards_variables_have_values(prometheus, traffic):
    values = promql.dashboard_values(JOB)
    for variable in promql.dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"]).groups()
        found = prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": promql.fill(selector, values)})
        assert found, (variable["name"], selector)
        if variable["name"] == "job":
            assert JOB in found


def test_every_recording_rule_is_recorded(prometheus, traffic):
    for rule in promql.rules():
        if "record" in rule:
            assert _answers(prometheus.query(rule["expr"])), rule["record"]
            assert wait_for(lambda r=rule: _answers(prometheus.query(r["record"])), timeout=10), rule["record"]


def test_every_rule_evaluates_without_error(prometheus, traffic):
    loaded = [rule for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(r.get("record") or r["alert"] for r in promql.rules())
    for rule in loaded:
        assert rule["health"] == "ok" and not rule.get("lastError"), (rule["name"], rule.get("lastError"))


def test_alerts_read_metrics_the_server_exports(prometheus, traffic):
    exported = set(prometheus.get("/api/v1/label/__name__/values"))
    recorded = {rule["record"] for rule in promql.rules() if "record" in rule}
    assert not set(NOT_EXPORTED_HERE) & exported, "an exemption names a metric the server exports now"
    for rule in promql.rules():
        if "alert" in rule:
            prometheus.query(rule["expr"])  # Prometheus evaluates it
            unknown = promql.metric_names(rule["expr"]) - exported - recorded - set(NOT_EXPORTED_HERE)
            assert not unknown, f"{rule['alert']} reads metrics no server exports: {unknown}"


def test_the_autoscalers_metrics_answer(prometheus, traffic):
    """prometheus-adapter's queries for the HorizontalPodAutoscaler, grouped by replica."""
    exported = set(prometheus.get("/api/v1/label/__name__/values"))
    served = {}
    for rule in promql.adapter_rules():
        served |= promql.adapter_metrics(rule, exported, "instance")
    assert {"specdec_requests_running", "specdec_requests_queued"} <= set(served)
    for metric, query in served.items():
        assert _answers(prometheus.query(query)), (metric, query)
