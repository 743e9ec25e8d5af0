"""What the deploy tests read from deploy/: the PromQL of the rules, the dashboard and the
prometheus-adapter config, with the dashboard's variables filled in, and the metric names an
expression reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "specdec.rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "specdec.json"
ADAPTER = DEPLOY / "kubernetes" / "prometheus-adapter" / "config.yaml"


def dashboard_values(job: str) -> dict[str, str]:
    """The dashboard's variables (and Grafana's rate interval) as a test fills them in: every
    replica and every proposer of the scrape job `job`."""
    return {"$__rate_interval": "5m", "$job": job, "$instance": ".*", "$proposer": ".*"}


def fill(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):  # $__rate_interval before any shorter name
        expr = expr.replace(name, values[name])
    assert "$" not in expr, f"a variable is left unfilled in {expr}"
    return expr


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query on the dashboard."""
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def adapter_rules() -> list[dict]:
    return yaml.safe_load(ADAPTER.read_text())["rules"]


def adapter_metrics(rule: dict, names: set[str], group_by: str) -> dict[str, str]:
    """The custom metrics a prometheus-adapter rule serves, as its seriesQuery discovers them among
    the series `names`, each with the PromQL the adapter runs for it (for every pod, grouped by
    `group_by`)."""
    pattern = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])[1]
    served = {}
    for name in sorted(n for n in names if re.search(pattern, n)):
        metric = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\g<1>"), name)
        query = rule["metricsQuery"].replace("<<.Series>>", name).replace("{<<.LabelMatchers>>}", "")
        served[metric] = query.replace("<<.GroupBy>>", group_by)
    return served


def documented_metrics() -> set[str]:
    """The server's metrics as docs/operations.md lists them, a histogram by its series."""
    names = set()
    for line in (DEPLOY.parent / "docs" / "operations.md").read_text().splitlines():
        if line.startswith("| `specdec_"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            metrics = re.findall(r"`(specdec_\w+)`", cells[0])
            suffixes = ("_bucket", "_sum", "_count") if cells[1] == "histogram" else ("",)
            names |= {metric + suffix for metric in metrics for suffix in suffixes}
    return names


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTORS = re.compile(r"\{[^}]*\}|\[[^\]]*\]")  # label matchers, range and subquery windows
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metrics (and recorded series) an expression reads: the identifiers left once strings,
    label matchers, windows and label lists are gone, less functions (a name before a
    parenthesis) and keywords."""
    bare = _GROUPINGS.sub(" ", _SELECTORS.sub(" ", _STRING.sub('""', expr)))
    names = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
    return {name for name in names if name not in _KEYWORDS}
