"""The core owns the backend contract: nothing under `ipam_provider/` imports a backend."""

from __future__ import annotations

import ast
from pathlib import Path

import ipam_provider

CORE = Path(ipam_provider.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (inside functions and TYPE_CHECKING blocks too)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_core_imports_no_backend() -> None:
    offenders = {
        f"{path.relative_to(CORE.parent)}: {module}"
        for path in sorted(CORE.rglob("*.py"))
        for module in imported_modules(path)
        if module == "backends" or module.startswith("backends.")
    }
    assert not offenders, f"the core must not import backends: {sorted(offenders)}"


def test_the_scan_sees_imports_at_any_depth(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from backends.protocol import PoolRef\n    import backends.registry\n")
    assert imported_modules(sample) == {"backends.protocol", "backends.registry"}


def test_the_historical_contract_path_still_serves_plugins() -> None:
    from backends import protocol
    from ipam_provider.backend import contract

    assert protocol.Backend is contract.Backend and protocol.PoolReport is contract.PoolReport
