"""What the Prometheus tests share: the real promtool and Prometheus server of PROMETHEUS_VERSION (the fixture
`prometheus_bins`, which fails with the build's output when they cannot be built; its users carry BUILT_WITH_GO),
the documented series (read from docs/prometheus-and-grafana.md, the one list of metric names the rules and the
dashboard may use), a PromQL scanner for the names and labels an expression uses, and synthetic history of every
documented series in OpenMetrics text, for promtool's backfill."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.prometheus import PrometheusBinaries, PrometheusUnavailable, prometheus_binaries

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "prometheus-and-grafana.md"
RULES = REPO / "config" / "prometheus" / "rules.yaml"
PROMETHEUS_RULE = REPO / "config" / "prometheus" / "prometheusrule.yaml"
RULE_TESTS = Path(__file__).resolve().parent / "prometheus_rules_test.yaml"
DASHBOARD = REPO / "config" / "grafana" / "ipam-provider-dashboard.json"
# Labels a scrape adds to every series, and the histogram bucket bound.
SCRAPE_LABELS = frozenset({"instance", "job"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# The mark of the tests that run promtool or prometheus (see conftest.py).
BUILT_WITH_GO = pytest.mark.apiserver

_TABLE_ROW = re.compile(r"^\| `([a-z_:][a-z0-9_:]*)` \| (counter|gauge|histogram) \|([^|]*)\|\s*$")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf"}
)


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...]


def documented_metrics() -> dict[str, Metric]:
    """The table of docs/prometheus-and-grafana.md ("The series the rules and the dashboard use")."""
    metrics: dict[str, Metric] = {}
    for line in DOC.read_text().splitlines():
        if match := _TABLE_ROW.match(line):
            labels = tuple(label.strip() for label in match.group(3).split(",") if label.strip())
            metrics[match.group(1)] = Metric(match.group(1), match.group(2), labels)
    return metrics


def series_names(metrics: dict[str, Metric]) -> set[str]:
    """The sample names the metrics expose: histograms as their _bucket, _sum and _count series."""
    names: set[str] = set()
    for metric in metrics.values():
        names |= {metric.name + s for s in HISTOGRAM_SUFFIXES} if metric.type == "histogram" else {metric.name}
    return names


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (identifiers that are not functions, keywords, label lists,
    label matchers, durations or template variables)."""
    text = _without_strings(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # template variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS:
            names.add(match.group(1))
    return names


def label_names_in(expr: str) -> set[str]:
    """The label names an expression matches on or aggregates by."""
    text = _without_strings(expr)
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    return labels


def _label_value(metric: Metric, label: str, index: int) -> str:
    """A plausible value of `label` on `metric`'s series number `index` (two series per metric)."""
    if label == "name":
        if metric.name.startswith("workqueue_"):
            return "ipam"
        if metric.name == "leader_election_master_status":
            return "capi-ipam-provider-py"
        return f"pool-{index}"
    values = {
        "backend": "incluster",
        "kind": "InClusterIPPool",
        "namespace": "default",
        "reason": ["Pending", "PoolExhausted"][index],
        "controller": "ipam" if metric.name.startswith("workqueue_") else ["ipaddressclaim", "inclusterippool"][index],
        "result": ["success", "requeue"][index],
        "operation": ["GET ipam/prefixes", "POST record:host"][index],
        "outcome": ["success", "unreachable"][index],
        "code": ["200", "409"][index],
        "method": "GET",
        "verb": "GET",
        "host": "127.0.0.1:6443",
    }
    return values.get(label, f"value-{index}")


def backfill_openmetrics(metrics: dict[str, Metric], start: int, end: int, step: int = 15) -> str:
    """Two series of every metric (one per replica) from `start` to `end` (unix seconds): counters rise by one per
    step, gauges move between 1 and 10 (pool_ready and leader status stay 1 on the first series, 0 on the second),
    histograms fill three buckets. The OpenMetrics text `promtool tsdb create-blocks-from openmetrics` reads."""
    lines: list[str] = []
    for metric in metrics.values():
        family = metric.name.removesuffix("_total") if metric.type == "counter" else metric.name
        lines.append(f"# TYPE {family} {metric.type}")
        for index in (0, 1):
            pairs = [(label, _label_value(metric, label, index)) for label in metric.labels]
            # Two replicas, as a scrape labels them.
            pairs += [("instance", f"10.0.0.{5 + index}:8443"), ("job", "capi-ipam-controller-manager-metrics-service")]
            labels = ",".join(f'{label}="{value}"' for label, value in pairs)
            for n, at in enumerate(range(start, end, step)):
                lines.extend(_samples(metric, labels, index, n, at))
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _samples(metric: Metric, labels: str, index: int, n: int, at: int) -> list[str]:
    def sample(name: str, value: float, extra: str = "") -> str:
        joined = ",".join(part for part in (labels, extra) if part)
        return f"{name}{{{joined}}} {value} {at}"

    if metric.type == "counter":
        return [sample(metric.name, n * (index + 1))]
    if metric.type == "histogram":
        buckets = [("0.1", n), ("1", 2 * n), ("+Inf", 3 * n)]
        return [
            *(sample(f"{metric.name}_bucket", count, f'le="{le}"') for le, count in buckets),
            sample(f"{metric.name}_sum", 1.2 * n),
            sample(f"{metric.name}_count", 3 * n),
        ]
    steady = metric.name in ("ipam_provider_pool_ready", "leader_election_master_status")
    return [sample(metric.name, (1 - index) if steady else 1 + (n + 3 * index) % 10)]


@pytest.fixture(scope="session")
def prometheus_bins() -> PrometheusBinaries:
    try:
        return prometheus_binaries()
    except PrometheusUnavailable as error:
        pytest.fail(str(error), pytrace=False)
