"""The figures of `benchmarks/incluster_throughput.py`, one result type per scenario, printed as one table per
scenario (with ours ÷ Go and ours ÷ limit rows) and written as JSON.

Every result row is named by a slug: `ours`, `go` or `limit`. A figure is None when it could not be had; a row
with an `error` has no figures beyond those measured before the failure."""

from __future__ import annotations

import collections
import json
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._support import MUTATING_VERBS, READ_VERBS, RequestCounts

Figure = float | int | None


@dataclass
class RunResult:
    """Common to every row: who, requests made, memory, CPU and duplicate addresses."""

    name: str
    slug: str
    claims: int
    requests: RequestCounts = field(default_factory=collections.Counter)
    peak_rss_kib: int | None = None
    window_cpu_seconds: float | None = None  # CPU spent over the measurement window only
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    @property
    def peak_rss_mib(self) -> float | None:
        return self.peak_rss_kib / 1024 if self.peak_rss_kib is not None else None

    @property
    def cpu_ms_per_claim(self) -> float | None:
        return None if self.window_cpu_seconds is None else self.window_cpu_seconds * 1000 / self.claims

    def per_claim(self, verbs: frozenset[str]) -> float | None:
        if not self.requests:
            return None
        return sum(n for (verb, _), n in self.requests.items() if verb in verbs) / self.claims

    @property
    def duplicate_count(self) -> int:
        return sum(len(v) for v in self.duplicates.values())

    def figures(self) -> dict[str, Figure]:
        """The row's figures by key (see the *_COLUMNS lists)."""
        raise NotImplementedError

    def extra_json(self) -> dict[str, Any]:
        """What the JSON has of the row besides its figures."""
        return {}

    def notes(self) -> list[str]:
        """Lines printed under the table about this row."""
        return []


@dataclass
class ThroughputResult(RunResult):
    """N claims created at once (20 in flight) over P pools, timed until all are fulfilled."""

    pools: int = 1
    seconds: float | None = None
    cpu_seconds: float | None = None  # the controller's CPU over its whole life (the limit: its writes)

    def figures(self) -> dict[str, Figure]:
        done = self.seconds is not None
        return {
            "seconds": self.seconds,
            "claims_per_second": self.claims / self.seconds if self.seconds else None,
            "cpu_seconds": self.cpu_seconds,
            "cpu_ms_per_claim": self.cpu_ms_per_claim,
            "peak_rss_mib": self.peak_rss_mib,
            "mutating_per_claim": self.per_claim(MUTATING_VERBS),
            "reads_per_claim": self.per_claim(READ_VERBS),
            "duplicates": self.duplicate_count if done else None,
        }

    def extra_json(self) -> dict[str, Any]:
        return {"pools": self.pools}


@dataclass
class SteadyResult(RunResult):
    """Claims created at a steady rate; latency from each create sent to its fulfilment seen on a watch."""

    rate: float = 0.0
    duration: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, one per fulfilled claim
    create_seconds: float | None = None  # how long the creates took (rate check)

    def figures(self) -> dict[str, Figure]:
        done = bool(self.latencies)
        ms = sorted(value * 1000 for value in self.latencies)
        cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
        return {
            "fulfilled": len(ms),
            "create_rate": self.claims / self.create_seconds if self.create_seconds else None,
            "p50_ms": cuts[49] if done else None,
            "p95_ms": cuts[94] if done else None,
            "p99_ms": cuts[98] if done else None,
            "max_ms": ms[-1] if done else None,
            "cpu_ms_per_claim": self.cpu_ms_per_claim,
            "peak_rss_mib": self.peak_rss_mib,
            "mutating_per_claim": self.per_claim(MUTATING_VERBS),
            "duplicates": self.duplicate_count if done else None,
        }


@dataclass
class RestartResult(RunResult):
    """A controller restarted with N fulfilled claims in place, and one new claim."""

    addresses: int = 0
    to_synced: float | None = None  # process start → its caches-synced log line
    to_fulfilled: float | None = None  # process start → the new claim's fulfilment seen on a watch
    create_to_fulfilled: float | None = None
    cpu_seconds: float | None = None  # the restarted process's CPU until the new claim was fulfilled

    def figures(self) -> dict[str, Figure]:
        return {
            "addresses_in_place": self.addresses,
            "seconds_to_synced": self.to_synced,
            "seconds_to_fulfilment": self.to_fulfilled,
            "create_to_fulfilment": self.create_to_fulfilled,
            "cpu_seconds": self.cpu_seconds,
            "peak_rss_mib": self.peak_rss_mib,
            "duplicates": self.duplicate_count if self.to_fulfilled is not None else None,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


@dataclass
class PoolsResult(RunResult):
    """N pools and C claims in each created at once, settled; the quiet 10 s after; one more pool; idle; one pool
    deleted. `claims` is N * C; `requests` are those of the settled window; `add_seconds` runs until the one more
    pool's status counts its claims, `add_fulfilled_seconds` until they are fulfilled."""

    pools: int = 0
    claims_per_pool: int = 0
    settled_seconds: float | None = None
    settled_cpu_seconds: float | None = None
    quiet_cpu_seconds: float | None = None  # the 10 s after settling
    idle_seconds: float = 0.0
    idle_cpu_seconds: float | None = None
    add_fulfilled_seconds: float | None = None
    add_seconds: float | None = None
    add_cpu_seconds: float | None = None
    delete_seconds: float | None = None
    delete_cpu_seconds: float | None = None
    repair_requests: RequestCounts | None = None  # one repair pass (ours)
    repair_pass_seconds: float | None = None
    scrape_cpu_seconds: float | None = None  # one metrics scrape (ours)
    scrape_bytes: int | None = None

    def figures(self) -> dict[str, Figure]:
        idle = self.idle_cpu_seconds
        return {
            "settled_seconds": self.settled_seconds,
            "settled_cpu_seconds": self.settled_cpu_seconds,
            "quiet_cpu_seconds": self.quiet_cpu_seconds,
            "idle_cpu_seconds": idle,
            "idle_cpu_percent": None if idle is None or not self.idle_seconds else 100 * idle / self.idle_seconds,
            "add_pool_fulfilled_seconds": self.add_fulfilled_seconds,
            "add_pool_seconds": self.add_seconds,
            "add_pool_cpu_ms": _ms(self.add_cpu_seconds),
            "delete_pool_seconds": self.delete_seconds,
            "delete_pool_cpu_ms": _ms(self.delete_cpu_seconds),
            "peak_rss_mib": self.peak_rss_mib,
            "mutating_per_claim": self.per_claim(MUTATING_VERBS),
            "requests_per_repair_pass": None if self.repair_requests is None else sum(self.repair_requests.values()),
            "scrape_cpu_ms": _ms(self.scrape_cpu_seconds),
            "duplicates": self.duplicate_count if self.settled_seconds is not None else None,
        }

    def extra_json(self) -> dict[str, Any]:
        repair = self.repair_requests
        return {
            "pools": self.pools,
            "claims_per_pool": self.claims_per_pool,
            "idle_seconds": self.idle_seconds,
            "repair_pass_seconds": self.repair_pass_seconds,
            "repair_requests": None if repair is None else {f"{v} {r}": n for (v, r), n in repair.most_common()},
            "scrape_bytes": self.scrape_bytes,
        }

    def notes(self) -> list[str]:
        if self.repair_requests is None:
            return []
        top = ", ".join(f"{v} {res} {n}" for (v, res), n in self.repair_requests.most_common(6))
        took = f", the pass took {self.repair_pass_seconds:.1f} s" if self.repair_pass_seconds is not None else ""
        scrape = f"; one metrics scrape: {self.scrape_bytes} bytes" if self.scrape_bytes is not None else ""
        return [f"one repair pass over {self.pools} pools: {top}{took}{scrape}"]


Column = tuple[str, str, str]  # figure key, header, format
THROUGHPUT_COLUMNS: list[Column] = [
    ("seconds", "seconds", "{:.1f}"),
    ("claims_per_second", "claims/s", "{:.1f}"),
    ("cpu_seconds", "CPU s", "{:.1f}"),
    ("cpu_ms_per_claim", "CPU ms/claim", "{:.2f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("mutating_per_claim", "mut. req/claim", "{:.2f}"),
    ("reads_per_claim", "reads/claim", "{:.2f}"),
    ("duplicates", "duplicates", "{}"),
]
STEADY_COLUMNS: list[Column] = [
    ("fulfilled", "fulfilled", "{}"),
    ("create_rate", "created/s", "{:.1f}"),
    ("p50_ms", "p50 ms", "{:.0f}"),
    ("p95_ms", "p95 ms", "{:.0f}"),
    ("p99_ms", "p99 ms", "{:.0f}"),
    ("max_ms", "max ms", "{:.0f}"),
    ("cpu_ms_per_claim", "CPU ms/claim", "{:.2f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("mutating_per_claim", "mut. req/claim", "{:.2f}"),
    ("duplicates", "duplicates", "{}"),
]
RESTART_COLUMNS: list[Column] = [
    ("addresses_in_place", "IPAddresses", "{}"),
    ("seconds_to_synced", "s to synced", "{:.2f}"),
    ("seconds_to_fulfilment", "s to 1st fulfilment", "{:.2f}"),
    ("create_to_fulfilment", "create→fulfilled s", "{:.2f}"),
    ("cpu_seconds", "CPU s", "{:.1f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("duplicates", "duplicates", "{}"),
]
POOLS_COLUMNS: list[Column] = [
    ("settled_seconds", "settled s", "{:.1f}"),
    ("settled_cpu_seconds", "CPU s", "{:.1f}"),
    ("quiet_cpu_seconds", "10 s after CPU s", "{:.2f}"),
    ("idle_cpu_seconds", "idle CPU s", "{:.2f}"),
    ("idle_cpu_percent", "idle % core", "{:.1f}"),
    ("add_pool_fulfilled_seconds", "+1 fulfilled s", "{:.2f}"),
    ("add_pool_seconds", "+1 counted s", "{:.2f}"),
    ("add_pool_cpu_ms", "+1 CPU ms", "{:.0f}"),
    ("delete_pool_seconds", "-1 pool s", "{:.2f}"),
    ("delete_pool_cpu_ms", "-1 CPU ms", "{:.0f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("mutating_per_claim", "mut. req/claim", "{:.2f}"),
    ("requests_per_repair_pass", "req/repair pass", "{}"),
    ("scrape_cpu_ms", "scrape CPU ms", "{:.1f}"),
    ("duplicates", "duplicates", "{}"),
]
NO_RATIO = frozenset({"seconds", "fulfilled", "create_rate", "addresses_in_place", "duplicates"})


def ratios(rows: Sequence[RunResult]) -> dict[str, dict[str, float]]:
    """ours ÷ go and ours ÷ limit for every figure both have (and a non-zero divisor)."""
    by_slug = {row.slug: row.figures() for row in rows}
    ours = by_slug.get("ours")
    result: dict[str, dict[str, float]] = {}
    for other in ("go", "limit"):
        theirs = by_slug.get(other)
        if ours is None or theirs is None:
            continue
        result[other] = {}
        for key, value in ours.items():
            divisor = theirs.get(key)
            if key not in NO_RATIO and value is not None and divisor:
                result[other][key] = value / divisor
    return result


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))))


def print_scenario(title: str, columns: list[Column], groups: Sequence[tuple[str, Sequence[RunResult]]]) -> None:
    """One table: a block of rows per group (e.g. per throughput size), each followed by its ratio rows."""
    print(f"\n== {title}")
    table = [["", *(header for _, header, _ in columns)]]
    for label, rows in groups:
        for row in rows:
            values = row.figures()
            cells = ["-" if values[key] is None else pattern.format(values[key]) for key, _, pattern in columns]
            table.append([f"{label}{row.name}", *cells])
        names = {"go": next((r.name for r in rows if r.slug == "go"), "Go"), "limit": "limit"}
        for other, figures in ratios(rows).items():
            cells = [f"{figures[key]:.2f}x" if key in figures else "" for key, _, _ in columns]
            table.append([f"{label}ours ÷ {names[other]}", *cells])
    _table(table)
    for label, rows in groups:
        for row in rows:
            if row.error:
                print(f"{label}{row.name}: FAILED: {row.error}")
            for note in row.notes():
                print(f"{label}{row.name}: {note}")
            for pool, twice in row.duplicates.items():
                print(f"{label}{row.name}: pool {pool} handed out {len(twice)} address(es) twice: {twice[:10]}")
            if row.requests:
                top = ", ".join(f"{v} {res} {n / row.claims:.2f}" for (v, res), n in row.requests.most_common(6))
                print(f"{label}{row.name} requests per claim: {top}")


def row_json(row: RunResult) -> dict[str, Any]:
    return {
        "name": row.name,
        "slug": row.slug,
        "claims": row.claims,
        **row.extra_json(),
        **row.figures(),
        "requests_per_claim": {f"{v} {res}": n / row.claims for (v, res), n in row.requests.most_common()},
        "duplicate_addresses": row.duplicates,
        "error": row.error,
    }


def write_json(
    path: Path, meta: dict[str, Any], scenarios: Mapping[str, Sequence[tuple[str, Sequence[RunResult]]]]
) -> None:
    """All figures: per scenario, per group, the rows and their ratios."""
    document: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **meta}
    for scenario, groups in scenarios.items():
        document[scenario] = [
            {"group": label.strip(" :"), "rows": [row_json(r) for r in rows], "ratios_ours_to": ratios(rows)}
            for label, rows in groups
        ]
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
