"""The dashboard and the alert rules query only metrics the code exports, and promtool accepts them.

Every PromQL expression is parsed (promql-parser, Prometheus's grammar) and its selectors' metric
names are checked against ``app.metrics.catalog``; a renamed metric fails here instead of leaving
an empty Grafana panel or an alert that can never fire.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.metrics.catalog import exported_series_names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "specrag.json"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "specrag.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS_OWN = {"up"}
"""Series Prometheus writes itself for every target (not exported by the code)."""
# Grafana's variables, as Grafana would substitute them before sending the query.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$model_pair": ".*",
    "$method": ".*",
}


def metric_names(expr: str) -> set[str]:
    """The metric names that ``expr``'s selectors select (raises on a PromQL syntax error)."""
    import promql_parser

    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)
            return
        if isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, promql_parser.AggregateExpr):
            walk(node.expr)
            if node.param is not None:
                walk(node.param)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                walk(arg)
        elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
            walk(node.expr)
        elif isinstance(node, promql_parser.SubqueryExpr):
            walk(node.expr)

    walk(promql_parser.parse(expr))
    return names


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    """(panel title, expression with Grafana's variables substituted) of every panel target."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: unknown Grafana variable in {expr}"
            yield panel["title"], expr
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"]
        found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert found, f"variable {variable['name']}: {query}"
        yield f"variable {variable['name']}", found.group(1)


def rule_exprs() -> tuple[list[tuple[str, str]], set[str]]:
    """(rule name, expression) of every rule, and the names the recording rules define."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    return [(rule.get("alert") or rule["record"], rule["expr"]) for rule in rules], recorded


def test_the_metric_name_extraction_sees_every_selector() -> None:
    expr = (
        'sum by (le) (rate(a_bucket{x="y"}[5m] offset 1d)) / ignoring(position) group_left '
        'sum(b_total) and absent(up{job="w"} == 1) or -(c) + {__name__="d"} '
        "+ max_over_time(e[10m:1m])"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "up", "c", "d", "e"}
    with pytest.raises(Exception):  # noqa: B017 - the parser's own error type
        metric_names("sum(rate(x[5m])")


def test_dashboard_queries_name_only_exported_metrics() -> None:
    exported = exported_series_names() | PROMETHEUS_OWN
    seen: set[str] = set()
    for title, expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, f"{title}: selects no metric"
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported"
        seen |= names
    # The panels the issue asks for are there: acceptance, tokens per pass, per position,
    # P95 per stage, queue depth, batch size and k, throughput.
    for needed in (
        "specrag_spec_decode_num_accepted_tokens_total",
        "specrag_target_forwards_total",
        "specrag_spec_decode_num_accepted_tokens_per_pos_total",
        "specrag_request_latency_seconds_bucket",
        "specrag_queue_depth",
        "specrag_engine_batch_size_sum",
        "specrag_engine_chosen_k_sum",
        "specrag_queries_total",
    ):
        assert needed in seen, f"no dashboard panel shows {needed}"


def test_rules_name_only_exported_metrics_and_cover_the_alerts() -> None:
    rules, recorded = rule_exprs()
    exported = exported_series_names() | PROMETHEUS_OWN | recorded
    for name, expr in rules:
        names = metric_names(expr)
        assert names <= exported, f"{name}: {sorted(names - exported)} not exported"
    alerts = {name for name, _ in rules if name not in recorded}
    assert {
        "SpecragAcceptanceCollapse",
        "SpecragLatencyP95Regression",
        "SpecragQueueGrowing",
        "SpecragWorkerDown",
    } <= alerts


def test_prometheus_scrapes_the_ports_the_compose_file_opens() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["specrag-api"]["static_configs"][0]["targets"] == ["api:8000"]
    workers = jobs["specrag-worker"]["dns_sd_configs"][0]
    for service in workers["names"]:
        env = compose["services"][service]["environment"]
        assert int(env["SPECRAG_METRICS_PORT"]) == workers["port"], service
    mounts = " ".join(compose["services"]["prometheus"]["volumes"])
    assert "./deploy/prometheus/rules:/etc/prometheus/rules" in mounts
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    grafana = " ".join(compose["services"]["grafana"]["volumes"])
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in grafana


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    # Each alert fires on the situation it is for and stays quiet on a healthy one.
    done = subprocess.run(
        [_promtool(), "test", "rules", RULES_TEST.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULES_TEST.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
