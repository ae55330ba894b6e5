"""The backend contract is typed: the core reaches a backend's optional capabilities through the `Capabilities` its
registration resolved, never by `getattr`/`hasattr`, and no backend attaches a contract method by assignment.

Rules, checked on the source's syntax tree:
- a module under `ipam_provider/` that imports `ipam_provider.backend` (and so may hold a backend) calls neither
  `getattr` nor `hasattr`;
- no module under `backends/` (nor the example plugin) assigns a contract method's name, as a class attribute or
  to an attribute of an object: a contract method is a member of `Backend` or `Repairable`, or a callable field of
  `Capabilities`.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import typing
from pathlib import Path

from ipam_provider.backend.protocol import Backend, Capabilities
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.backend.repair import Repairable
from tests.support.fake_backend import FakeBackend

ROOT = Path(__file__).resolve().parents[3]
BACKEND_SOURCES = [ROOT / "backends", ROOT / "tests" / "plugin_package"]


def contract_methods() -> set[str]:
    """The names of every method of the backend contract."""
    names = {
        name
        for protocol in (Backend, Repairable)
        for name, member in vars(protocol).items()
        if not name.startswith("_") and callable(member)  # `kinds` is a property, not a method
    }
    hints = typing.get_type_hints(Capabilities)
    for field in dataclasses.fields(Capabilities):
        offered = [arg for arg in typing.get_args(hints[field.name]) if arg is not type(None)]
        if any(typing.get_origin(arg) is collections.abc.Callable for arg in offered):
            names.add(field.name)
    return names


def reflection_calls(tree: ast.AST) -> list[int]:
    """The lines that call `getattr` or `hasattr`."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}
    ]


def sees_backends(tree: ast.AST) -> bool:
    """Whether the module imports from `ipam_provider.backend`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ipam_provider.backend"):
            return True
        if isinstance(node, ast.Import) and any(a.name.startswith("ipam_provider.backend") for a in node.names):
            return True
    return False


def method_assignments(tree: ast.AST, methods: set[str]) -> list[str]:
    """`line: target` for each assignment of a contract method's name, in a class body or to an attribute."""
    found = []
    class_body = {id(stmt) for parent in ast.walk(tree) if isinstance(parent, ast.ClassDef) for stmt in parent.body}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            in_class = isinstance(target, ast.Name) and id(node) in class_body
            if name in methods and (isinstance(target, ast.Attribute) or in_class):
                found.append(f"{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_contract_names_its_methods() -> None:
    assert {"allocate", "capabilities", "list_holdings", "prepare", "sweep_orphaned"} <= contract_methods()
    assert not {"kinds", "name", "report_interval", "concurrent_claims"} & contract_methods()


def test_the_core_never_reflects_on_a_backend() -> None:
    offenders = []
    for path in sorted((ROOT / "ipam_provider").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if sees_backends(tree):
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in reflection_calls(tree)]
    assert not offenders, f"getattr/hasattr where a backend is in reach (use its Capabilities): {offenders}"


def test_no_backend_attaches_a_contract_method_by_assignment() -> None:
    methods, offenders = contract_methods(), []
    for path in sorted(p for folder in BACKEND_SOURCES for p in folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        offenders += [f"{path.relative_to(ROOT)}:{found}" for found in method_assignments(tree, methods)]
    assert not offenders, f"contract methods attached by assignment (define them with def): {offenders}"


def test_capabilities_are_resolved_once_at_registration() -> None:
    backend = FakeBackend(report_interval=60.0)
    registry = BackendRegistry([backend])
    backend.report_interval = 5.0
    assert registry.capabilities(backend).report_interval == 60.0
    assert registry.capabilities(FakeBackend()) == Capabilities(), "an unregistered backend offers nothing"
