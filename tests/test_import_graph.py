"""The import rules of `ipam_provider/` and `backends/`: no circle; the core imports no backend; the runtime
(`ipam_provider/runtime/`) imports nothing of the IPAM domain. Every import counts, those inside functions and under
`TYPE_CHECKING` too, since each is a dependency a reader has to hold."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    found = {}
    for package in ("ipam_provider", "backends"):
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `path` imports; `from package import module` names the module alone."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known.keys()
            named.update(submodules or {node.module})
    return named & known.keys()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    assert circles(graph) == []


def test_the_core_imports_no_backend() -> None:
    known = modules()
    offenders = {
        f"{name} -> {imported}"
        for name, path in known.items()
        if name.startswith("ipam_provider")
        for imported in imports(path, known)
        if imported.startswith("backends")
    }
    assert not offenders, f"the core must not import backends: {sorted(offenders)}"


RUNTIME_MAY_IMPORT = ("ipam_provider.runtime", "ipam_provider.version")  # the version is a constant, not IPAM


def test_the_runtime_imports_nothing_of_the_domain() -> None:
    known = modules()
    offenders = {
        f"{name} -> {imported}"
        for name, path in known.items()
        if name.startswith("ipam_provider.runtime")
        for imported in imports(path, known)
        if not any(imported == allowed or imported.startswith(allowed + ".") for allowed in RUNTIME_MAY_IMPORT)
    }
    assert not offenders, f"the runtime must not import the IPAM domain: {sorted(offenders)}"


def test_the_scan_sees_imports_at_any_depth(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from ipam_provider.admission import Route\n    import ipam_provider.api.capi\n")
    known = {"ipam_provider.admission": sample, "ipam_provider.api.capi": sample, "ipam_provider.api": sample}
    assert imports(sample, known) == {"ipam_provider.admission", "ipam_provider.api.capi"}


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
