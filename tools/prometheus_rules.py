"""Write config/prometheus/prometheusrule.yaml from config/prometheus/rules.yaml: `python -m tools.prometheus_rules`
(`make generate` runs it; `--check` exits 1 if the file differs from what would be written).

The plain rules file is the one source of truth (promtool checks and unit-tests it; a Prometheus without the
operator loads it as is); the PrometheusRule carries its groups unchanged as `spec`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
RULES = REPO_ROOT / "config" / "prometheus" / "rules.yaml"
PROMETHEUS_RULE = REPO_ROOT / "config" / "prometheus" / "prometheusrule.yaml"
HEADER = """\
# GENERATED from rules.yaml by `python -m tools.prometheus_rules` (make generate): edit rules.yaml, not this file.
# The provider's alerting rules for the Prometheus Operator. A Prometheus selects PrometheusRules by label
# (its spec.ruleSelector): add the label yours wants, e.g. `release: <name>` for the kube-prometheus-stack chart,
# in an overlay. What each alert means and what to do: docs/prometheus-and-grafana.md.
"""


class _BlockStyleDumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL expressions) as `|` blocks, long texts folded (`>-`), as in rules.yaml."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockStyleDumper.add_representer(str, _represent_str)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object whose spec is the plain rules file's content."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "capi-ipam-provider-rules",
            "namespace": "capi-ipam-system",
            "labels": {"control-plane": "controller-manager"},
        },
        "spec": rules,
    }


def render(rules_path: Path = RULES) -> str:
    rules = yaml.safe_load(rules_path.read_text())
    body = yaml.dump(prometheus_rule(rules), Dumper=_BlockStyleDumper, sort_keys=False, width=120)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if prometheusrule.yaml is not up to date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PROMETHEUS_RULE.read_text() != text:
            print(f"{PROMETHEUS_RULE} is out of date: run `python -m tools.prometheus_rules`", file=sys.stderr)
            return 1
        return 0
    PROMETHEUS_RULE.write_text(text)
    print(f"wrote {PROMETHEUS_RULE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
