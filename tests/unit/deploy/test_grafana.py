"""deploy/grafana/specdec.json: a dashboard Grafana imports as it is (its datasource a variable,
the current JSON model), with the panels operators look for, each query filtered by the
dashboard's variables and reading metrics the server documents, Triton's or the cluster's.
tests/server/test_prometheus.py runs every query against a real Prometheus."""

from __future__ import annotations

import itertools
import re

from unit.deploy import promql

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# what an operator looks for, each a panel
PANELS = {
    "Output tokens/s", "Requests/s by finish reason", "Refusals by reason", "Running and queued",
    "Time to first token p50 / p90 / p99", "Time per output token p50 / p90 / p99",
    "Request duration p50 / p90 / p99", "Queue time p50 / p90 / p99", "Acceptance rate", "Mean accepted length",
    "Acceptance by draft position", "Draft length chosen", "KV slots", "Prefix reuse", "Memory",
    "Scrapes and restarts", "GPU utilization", "GPU memory",
}  # fmt: skip
# metrics from elsewhere than the server: the kubelet's cAdvisor and kube-state-metrics, in a cluster
CLUSTER_METRICS = {"container_memory_working_set_bytes", "kube_pod_container_status_restarts_total"}


def panels() -> list[dict]:
    return [panel for panel in promql.dashboard()["panels"] if panel["type"] != "row"]


def test_it_imports_as_it_is():
    dashboard = promql.dashboard()
    assert dashboard["schemaVersion"] == 41 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("job", "instance", "proposer"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"] == DATASOURCE, name
    for panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), panel["title"]
        assert panel["description"], panel["title"]


def test_the_panels_are_there_and_do_not_overlap():
    assert {panel["title"] for panel in panels()} >= PANELS
    everything = promql.dashboard()["panels"]
    assert len({panel["id"] for panel in everything}) == len(everything)
    cells = {}
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for cell in itertools.product(range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])):
            assert cell not in cells, f"{panel['title']} overlaps {cells[cell]}"
            cells[cell] = panel["title"]


def test_every_query_reads_known_metrics_through_the_variables():
    documented = promql.documented_metrics()
    for panel, ref, expr in promql.dashboard_targets():
        metrics = promql.metric_names(expr)
        assert metrics, (panel, ref)
        if metrics <= CLUSTER_METRICS:
            continue  # labelled by pod, not by the scrape job
        assert all(m in documented or m.startswith("nv_") or m == "up" for m in metrics), (panel, ref, metrics)
        # every selector is narrowed to the chosen job and replicas (and proposers, where labelled)
        selectors = re.findall(r"\b(\w+)\{([^}]*)\}", expr)
        assert len(selectors) == len(re.findall(r"\b(?:specdec|nv)_\w+|\bup\b", expr)), (panel, ref, expr)
        for _, matchers in selectors:
            assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (panel, ref, expr)
        if "histogram_quantile" in expr:
            assert re.search(r"sum by \(le\) \(rate\(\w+_bucket\{", expr), (panel, ref, expr)
