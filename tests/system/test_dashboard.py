"""config/grafana/ipam-provider-dashboard.json: it parses, has the variables and panels an operator needs, uses only
the documented series, and every panel's queries return data from a real Prometheus whose TSDB holds history of
every documented series (backfilled with promtool), drawn into a PNG by tools/dashboard_render.py."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.prometheus import (
    BUILT_WITH_GO,
    DASHBOARD,
    SCRAPE_LABELS,
    backfill_openmetrics,
    documented_metrics,
    label_names_in,
    metric_names_in,
    series_names,
)
from tools.dashboard_render import graph_panels, load_dashboard, panel_exprs, render
from tools.prometheus import PrometheusBinaries, PrometheusServer

# A metric an operator looks for, and a piece of the expression that shows it is there.
REQUIRED = {
    "pool usage": "ipam_provider_allocated_ips",
    "pool free": "ipam_provider_available_ips",
    "allocation rate": "rate(ipam_provider_allocation_total",
    "allocation p50": "histogram_quantile(0.5, sum by (le) (rate(ipam_provider_allocation_duration_seconds_bucket",
    "allocation p95": "histogram_quantile(0.95, sum by (le) (rate(ipam_provider_allocation_duration_seconds_bucket",
    "allocation p99": "histogram_quantile(0.99, sum by (le) (rate(ipam_provider_allocation_duration_seconds_bucket",
    "errors by reason": "sum by (reason) (rate(ipam_provider_allocation_errors_total",
    "waiting claims by reason": "ipam_provider_waiting_claims",
    "queue depth": "workqueue_depth",
    "queue retries": "workqueue_retries_total",
    "reconcile rate": "controller_runtime_reconcile_total",
    "reconcile errors": "controller_runtime_reconcile_errors_total",
    "backend requests by operation": "sum by (backend, operation, outcome) (rate(ipam_provider_backend_requests_total",
    "backend latency by operation": "ipam_provider_backend_request_duration_seconds_bucket",
    "REST requests by code": "sum by (code, method) (rate(rest_client_requests_total",
    "leader": "leader_election_master_status",
}


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [expr for panel in graph_panels(dashboard) for expr, _ in panel_exprs(panel)]


def test_the_dashboard_parses_and_has_its_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name, label in (("backend", "backend"), ("kind", "kind"), ("namespace", "namespace"), ("pool", "name")):
        assert variables[name]["type"] == "query", name
        assert variables[name]["definition"].endswith(f", {label})"), variables[name]["definition"]
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name


def test_every_panel_queries_prometheus_through_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    panels = graph_panels(dashboard)
    assert len(panels) >= 12
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        exprs = panel_exprs(panel)
        assert exprs and all(expr.strip() for expr, _ in exprs), f"{panel['title']} has no PromQL expression"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    exprs = all_exprs(load_dashboard())
    missing = [what for what, piece in REQUIRED.items() if not any(piece in expr for expr in exprs)]
    assert missing == []


def test_the_dashboard_uses_only_the_documented_series_and_labels() -> None:
    metrics = documented_metrics()
    names = series_names(metrics)
    labels = {label for m in metrics.values() for label in m.labels} | SCRAPE_LABELS | {"le"}
    dashboard = load_dashboard()
    queries = all_exprs(dashboard)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(SELECTOR, LABEL): Grafana's, not PromQL
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
            assert match, variable["definition"]
            assert match.group(2) in labels, variable["definition"]
            queries.append(match.group(1))
    for expr in queries:
        assert metric_names_in(expr) <= names, f"undocumented series {metric_names_in(expr) - names} in {expr}"
        assert label_names_in(expr) <= labels, f"unknown labels {label_names_in(expr) - labels} in {expr}"


def backfilled_tsdb(bins: PrometheusBinaries, directory: Path, start: int, end: int) -> Path:
    source, tsdb = directory / "history.om", directory / "tsdb"
    source.write_text(backfill_openmetrics(documented_metrics(), start, end))
    result = subprocess.run(
        [str(bins.promtool), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"promtool backfill failed:\n{result.stdout}{result.stderr}"
    return tsdb


@BUILT_WITH_GO
def test_every_panel_draws_data_from_a_real_prometheus(prometheus_bins: PrometheusBinaries, tmp_path: Path) -> None:
    end = int(time.time()) - 120
    start = end - 30 * 60
    tsdb = backfilled_tsdb(prometheus_bins, tmp_path, start, end)
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    out = tmp_path / "dashboard.png"
    with PrometheusServer(prometheus_bins.prometheus, config, tsdb, tmp_path / "prometheus.log") as server:
        results = render(server.url, start, end, out)
    empty = [(r.title, r.exprs, r.errors) for r in results if r.errors or not r.series]
    assert empty == [], "panels without data"
    assert len(results) == len(graph_panels(load_dashboard()))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 50_000, "the picture looks blank"
