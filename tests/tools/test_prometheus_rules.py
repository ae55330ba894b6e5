"""The alerting rules: promtool accepts them and their unit tests pass, the PrometheusRule carries exactly the plain
rules file, every alert is annotated for an operator, and they use only the documented series."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.support.prometheus import (
    BUILT_WITH_GO,
    DOC,
    PROMETHEUS_RULE,
    RULE_TESTS,
    RULES,
    SCRAPE_LABELS,
    documented_metrics,
    label_names_in,
    metric_names_in,
    series_names,
)
from tools.prometheus import PrometheusBinaries
from tools.prometheus_rules import render

EXPECTED_ALERTS = {
    "IPAMPoolNearlyFull",
    "IPAMPoolExhausted",
    "IPAMAllocationErrors",
    "IPAMBackendUnreachable",
    "IPAMNoLeader",
    "IPAMDuplicateAddress",
}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def promtool(bins: PrometheusBinaries, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bins.promtool), *args], capture_output=True, text=True, timeout=300, check=False)


@BUILT_WITH_GO
def test_promtool_check_rules_accepts_the_rules(prometheus_bins: PrometheusBinaries) -> None:
    result = promtool(prometheus_bins, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@BUILT_WITH_GO
def test_promtool_unit_tests_pass(prometheus_bins: PrometheusBinaries) -> None:
    """Each alert fires on series named as the controller emits them, and not in the healthy cases."""
    result = promtool(prometheus_bins, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {a["alertname"] for c in cases for a in c["alert_rule_test"] if a["exp_alerts"]}
    silent = {a["alertname"] for c in cases for a in c["alert_rule_test"] if not a["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules()}
    assert alerts == EXPECTED_ALERTS
    assert alerts - firing == set(), "alerts never expected to fire"
    assert alerts - silent == set(), "alerts without a case where they must not fire"


def test_the_prometheus_rule_carries_exactly_the_plain_rules() -> None:
    documents = [d for d in yaml.safe_load_all(PROMETHEUS_RULE.read_text()) if d]
    assert len(documents) == 1
    rule = documents[0]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert PROMETHEUS_RULE.read_text() == render(), "run `python -m tools.prometheus_rules` (make generate)"


def test_every_alert_tells_an_operator_what_and_where_to_look() -> None:
    headings = {line.lstrip("#").strip().lower() for line in DOC.read_text().splitlines() if line.startswith("### ")}
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule.get("for"), f"{name} has no `for`: it would fire on a single evaluation"
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= annotations.keys(), name
        page, anchor = annotations["runbook"].split("#")
        assert page == "docs/prometheus-and-grafana.md" and anchor == name.lower(), annotations["runbook"]
        assert anchor in headings, f"docs/prometheus-and-grafana.md has no section for {name}"


def test_rules_and_their_tests_use_only_the_documented_series_and_labels() -> None:
    metrics = documented_metrics()
    assert len(metrics) >= 25, f"the table of {DOC.name} was not read: {sorted(metrics)}"
    names = series_names(metrics)
    labels = {label for m in metrics.values() for label in m.labels} | SCRAPE_LABELS | {"le"}
    for rule in rules():
        used = metric_names_in(rule["expr"])
        assert used, f"no metric found in {rule['alert']}'s expression"
        assert used <= names, f"{rule['alert']} uses undocumented series {used - names}"
        assert label_names_in(rule["expr"]) <= labels, f"{rule['alert']}: {label_names_in(rule['expr']) - labels}"
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for series in case["input_series"]:
            name, _, rest = series["series"].partition("{")
            assert name in names, f"test input {name} is not a documented series"
            metric = metrics[name]
            keys = {pair.split("=")[0] for pair in rest.rstrip("}").split(",") if pair}
            assert keys == set(metric.labels) | SCRAPE_LABELS, f"{series['series']}: labels are not {metric.labels}"


def test_the_promql_scanner_finds_names_and_labels() -> None:
    """The scanner the checks above rely on: names, not functions, keywords, matchers or variables."""
    expr = (
        'histogram_quantile(0.95, sum by (le, verb) (rate(rest_client_request_duration_seconds_bucket{job=~"$job"}'
        '[$__rate_interval]))) or absent(up{name="x"}) unless on (backend) foo_total > 0.9'
    )
    assert metric_names_in(expr) == {"rest_client_request_duration_seconds_bucket", "up", "foo_total"}
    assert label_names_in(expr) == {"le", "verb", "job", "name", "backend"}
