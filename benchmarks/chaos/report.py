"""One chaos run's result per backend, printed as a table (one row per backend) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

CHECKS = ("duplicates", "leaks", "unfulfilled", "unrecorded")
CHECK_TITLES = {
    "duplicates": "duplicate addresses",
    "leaks": "leaked allocations",
    "unfulfilled": "unfulfilled claims",
    "unrecorded": "IPAddresses without allocation",
}


@dataclass
class BackendResult:
    backend: str
    seed: int
    operations: int = 0  # allocations (claims created) + releases (claims deleted)
    allocations: int = 0
    releases: int = 0
    seconds: float = 0.0  # from the first operation to the final check
    fault_kinds: list[str] = field(default_factory=list)  # every kind the run was to inject
    faults: dict[str, int] = field(default_factory=dict)  # kind -> times injected
    checks: dict[str, int] = field(default_factory=dict)  # check -> count (CHECKS)
    details: dict[str, list[str]] = field(default_factory=dict)  # check -> examples
    notes: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        every_kind = all(self.faults.get(kind, 0) > 0 for kind in self.fault_kinds)
        return not self.error and every_kind and len(self.checks) == len(CHECKS) and not any(self.checks.values())


def table(results: Sequence[BackendResult]) -> str:
    """A Markdown table: backend, operations, run time, each fault kind's count, the four check counts."""
    kinds: list[str] = []
    for result in results:
        kinds += [kind for kind in result.fault_kinds if kind not in kinds]
    header = ["backend", "operations (allocations + releases)", "run time", *kinds, *(CHECK_TITLES[c] for c in CHECKS)]
    rows = [header, ["---"] * len(header)]
    for result in results:
        faults = [str(result.faults.get(k, 0)) if k in result.fault_kinds else "-" for k in kinds]
        checks = [str(result.checks[c]) if c in result.checks else "?" for c in CHECKS]
        operations = f"{result.operations} ({result.allocations} + {result.releases})"
        rows.append([result.backend, operations, f"{result.seconds:.0f} s", *faults, *checks])
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    for result in results:
        if result.error:
            lines.append(f"\n{result.backend}: FAILED: {result.error}")
        for check, examples in result.details.items():
            for example in examples:
                lines.append(f"{result.backend}: {check}: {example}")
        missing = [kind for kind in result.fault_kinds if not result.faults.get(kind)]
        if missing:
            lines.append(f"{result.backend}: never injected: {', '.join(missing)}")
    return "\n".join(lines)


def to_json(results: Sequence[BackendResult]) -> str:
    return json.dumps([{**asdict(result), "passed": result.passed} for result in results], indent=2)
