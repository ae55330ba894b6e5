"""Render a Grafana dashboard's panels from a real Prometheus into a PNG, without Grafana.

    python -m tools.dashboard_render --prometheus http://127.0.0.1:9090 --last 30m --out dashboard.png \
        [--dashboard config/grafana/ipam-provider-dashboard.json] [--var pool=nodes] [--start T --end T]

Every panel's PromQL targets are run through the HTTP API (`/api/v1/query_range`) over the time range and drawn on
the dashboard's grid (gridPos: 24 columns): a title per panel, a line per series named by the target's
legendFormat (ten colours, then the same colours dashed and dotted), a legend (at most 12 series, 8 on narrow
panels: those with the highest peaks, and how many more), and "no data" where a panel has no series. Row panels
become section headings.

Template variables: `$__rate_interval` is 4 x the step, at least `--rate-interval` (default 1m), as Grafana does
with a 15 s scrape interval; multi-value variables with "All" become their allValue (`.*`); a textbox its value;
`--var NAME=VALUE` sets any. Needs matplotlib (the `test` extra).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.prometheus import api_get

REPO_ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = REPO_ROOT / "config" / "grafana" / "ipam-provider-dashboard.json"
GRID_COLUMNS = 24
INCHES_PER_COLUMN = 0.8
INCHES_PER_ROW = 0.36  # a Grafana grid row is 30 px against a column of ~80 px
MAX_POINTS = 240
LEGEND_ENTRIES = 12  # per legend; 8 on panels narrower than half the grid
NARROW_LEGEND_ENTRIES = 8
COLORS = 10  # matplotlib's default cycle C0..C9; further series reuse them with another line style
LINE_STYLES = ("-", "--", ":")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass
class Series:
    legend: str
    times: list[float]
    values: list[float]


@dataclass
class PanelResult:
    title: str
    unit: str
    grid: dict[str, int]
    exprs: list[str]
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that draw data (rows and collapsed rows' contents flattened; rows themselves left out)."""
    found: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def panel_exprs(panel: dict[str, Any]) -> list[tuple[str, str]]:
    """(expr, legendFormat) of each visible target of a panel."""
    return [(t["expr"], t.get("legendFormat", "")) for t in panel.get("targets", []) if not t.get("hide")]


def variable_values(dashboard: dict[str, Any], overrides: dict[str, str]) -> dict[str, str]:
    """What each template variable stands for in the queries (see the module docstring)."""
    values: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        name, kind = variable["name"], variable.get("type")
        if kind == "datasource":
            continue
        if kind in ("textbox", "constant", "custom"):
            current = variable.get("current", {}).get("value", variable.get("query", ""))
            values[name] = current[0] if isinstance(current, list) else str(current)
        else:
            values[name] = variable.get("allValue") or ".*"
    values.update(overrides)
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace `$name` and `${name}` (longest name wins, as the regex is greedy on \\w+); unknown names stay."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(replace, expr)


def legend_text(legend_format: str, labels: dict[str, str]) -> str:
    if not legend_format:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return _LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), legend_format).strip()


def query_panel(url: str, panel: dict[str, Any], values: dict[str, str], start: float, end: float) -> PanelResult:
    """Run every target of `panel` over [start, end]; a failing query is recorded, not raised."""
    step = max(1.0, math.ceil((end - start) / MAX_POINTS))
    rate_interval = f"{int(max(4 * step, _seconds(values.get('__rate_interval_min', '1m'))))}s"
    scoped = values | {"__rate_interval": rate_interval, "__interval": f"{int(step)}s"}
    result = PanelResult(
        title=panel.get("title", ""),
        unit=panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short"),
        grid=panel["gridPos"],
        exprs=[],
    )
    for expr, legend_format in panel_exprs(panel):
        expr = substitute(expr, scoped)
        result.exprs.append(expr)
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}"}
        try:
            data = api_get(url, "/api/v1/query_range", params)
        except (RuntimeError, OSError) as error:
            result.errors.append(str(error))
            continue
        for item in data["result"]:
            points = [(float(t), float(v)) for t, v in item["values"]]
            result.series.append(
                Series(legend_text(legend_format, item["metric"]), [t for t, _ in points], [v for _, v in points])
            )
    return result


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration.strip())
    if not match:
        raise ValueError(f"not a duration: {duration!r} (e.g. 30s, 5m, 1h)")
    return float(match.group(1)) * units[match.group(2)]


def legend_series(series: list[Series], limit: int) -> list[int]:
    """Indices of the series the legend names, in query order: all of them when there are at most `limit`, else the
    `limit` with the highest peaks (series without a value rank last)."""
    if len(series) <= limit:
        return list(range(len(series)))

    def peak(index: int) -> float:
        values = [v for v in series[index].values if not math.isnan(v)]
        return max(values, default=-math.inf)

    return sorted(sorted(range(len(series)), key=peak, reverse=True)[:limit])


def _formatter(unit: str) -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(value: float, _pos: int) -> str:
        if unit == "percentunit":
            return f"{value * 100:.3g}%"
        if unit == "bytes":
            scaled, power = value, 0
            while abs(scaled) >= 1024 and power < 3:
                scaled, power = scaled / 1024, power + 1
            return f"{scaled:.4g} {('', 'Ki', 'Mi', 'Gi')[power]}B"
        if unit == "s":
            return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
        return f"{value:.3g}"

    return FuncFormatter(fmt)


def draw(
    dashboard: dict[str, Any], results: list[PanelResult], out: Path, span: tuple[float, float], subtitle: str
) -> None:
    """Draw the panels on the dashboard's grid into `out` (PNG), every time axis over `span` (unix seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [p for p in dashboard.get("panels", []) if p.get("type") == "row"]
    height_units = max(g["y"] + g["h"] for g in [*(r.grid for r in results), *(p["gridPos"] for p in rows)])
    top = 1.2  # inches for the dashboard title
    width, height = GRID_COLUMNS * INCHES_PER_COLUMN, height_units * INCHES_PER_ROW + top
    figure = plt.figure(figsize=(width, height), dpi=80)
    figure.text(0.01, 1 - 0.35 / height, dashboard.get("title", ""), fontsize=18, weight="bold", va="top")
    figure.text(0.01, 1 - 0.8 / height, subtitle, fontsize=10, color="dimgray", va="top")

    def box(grid: dict[str, int], pad: float = 0.45) -> tuple[float, float, float, float]:
        left = (grid["x"] * INCHES_PER_COLUMN + pad) / width
        bottom = 1 - (top + (grid["y"] + grid["h"]) * INCHES_PER_ROW - pad * 0.9) / height
        w = (grid["w"] * INCHES_PER_COLUMN - 1.6 * pad) / width
        h = (grid["h"] * INCHES_PER_ROW - 1.9 * pad) / height
        return left, bottom, w, h

    for row in rows:
        left, bottom, _, _ = box(row["gridPos"], pad=0.1)
        figure.text(left, bottom, row.get("title", ""), fontsize=13, weight="bold", color="#333333")
    for result in results:
        axes = figure.add_axes(box(result.grid))
        axes.set_title(result.title, fontsize=10, loc="left")
        axes.tick_params(labelsize=7)
        axes.grid(True, alpha=0.3)
        axes.yaxis.set_major_formatter(_formatter(result.unit))
        locator = mdates.AutoDateLocator(maxticks=7)  # type: ignore[no-untyped-call]
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=False))  # type: ignore[no-untyped-call]
        axes.set_xlim(*(dt.datetime.fromtimestamp(t) for t in span))  # type: ignore[arg-type]
        lines = []
        for number, series in enumerate(result.series):
            times = [dt.datetime.fromtimestamp(t) for t in series.times]
            look = {"color": f"C{number % COLORS}", "linestyle": LINE_STYLES[number // COLORS % len(LINE_STYLES)]}
            (line,) = axes.plot(times, series.values, linewidth=1.2, **look)  # type: ignore[arg-type]
            lines.append(line)
        if result.series:
            shown = legend_series(
                result.series, LEGEND_ENTRIES if result.grid["w"] >= GRID_COLUMNS // 2 else NARROW_LEGEND_ENTRIES
            )
            handles: list[Any] = [lines[i] for i in shown]
            labels = [result.series[i].legend for i in shown]
            if len(shown) < len(result.series):
                handles.append(Line2D([], [], linestyle="none"))
                labels.append(f"+{len(result.series) - len(shown)} more (lower peaks)")
            columns = 2 if len(labels) > 5 else 1
            axes.legend(handles, labels, fontsize=6, loc="upper left", framealpha=0.6, ncol=columns)
        else:
            message = "query failed" if result.errors else "no data"
            axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes, color="gray")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)


def render(
    url: str,
    start: float,
    end: float,
    out: Path,
    dashboard_path: Path = DASHBOARD,
    overrides: dict[str, str] | None = None,
) -> list[PanelResult]:
    """Query every panel of the dashboard over [start, end] and draw the PNG; return what each panel got."""
    dashboard = load_dashboard(dashboard_path)
    values = variable_values(dashboard, overrides or {})
    results = [query_panel(url, panel, values, start, end) for panel in graph_panels(dashboard)]
    span = f"{dt.datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to {dt.datetime.fromtimestamp(end):%H:%M:%S}"
    draw(
        dashboard,
        results,
        out,
        (start, end),
        f"{url}, {span}, rendered from {dashboard_path.name} by tools/dashboard_render.py",
    )
    return results


def _timestamp(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return dt.datetime.fromisoformat(text).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="base URL of the Prometheus HTTP API")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--last", default="1h", help="time range ending now (default 1h); ignored with --start")
    parser.add_argument("--start", help="range start: unix seconds or ISO 8601")
    parser.add_argument("--end", help="range end: unix seconds or ISO 8601 (default now)")
    parser.add_argument("--rate-interval", default="1m", help="the least $__rate_interval (default 1m)")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="set a template variable")
    args = parser.parse_args(argv)
    end = _timestamp(args.end) if args.end else time.time()
    start = _timestamp(args.start) if args.start else end - _seconds(args.last)
    overrides = dict(v.split("=", 1) for v in args.var) | {"__rate_interval_min": args.rate_interval}
    results = render(args.prometheus, start, end, args.out, args.dashboard, overrides)
    for result in results:
        state = f"{len(result.series)} series" + (f", {len(result.errors)} failed queries" if result.errors else "")
        print(f"{result.title}: {state}")
        for error in result.errors:
            print(f"  {error}", file=sys.stderr)
    print(f"wrote {args.out}")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
