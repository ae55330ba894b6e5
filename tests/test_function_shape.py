"""Every production function of `ipam_provider/`, `backends/` and `hack/` is at most MAX_LINES long (from its `def`
to its last line, decorators excluded) and takes at most MAX_PARAMETERS parameters, keyword-only ones and `*args` /
`**kwargs` included, `self` and `cls` not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 50
MAX_PARAMETERS = 6

Function = ast.FunctionDef | ast.AsyncFunctionDef


def parameters(function: Function) -> int:
    arguments = function.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    if named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (arguments.vararg is not None) + (arguments.kwarg is not None)


def offenders(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LINES:
                found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
            if parameters(node) > MAX_PARAMETERS:
                found.append(f"{where}:{node.lineno} {node.name}: {parameters(node)} parameters")
    return found


def test_no_function_is_too_long_or_takes_too_many_parameters() -> None:
    found = [
        offender
        for package in ("ipam_provider", "backends", "hack")
        for path in sorted((ROOT / package).rglob("*.py"))
        for offender in offenders(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_measure_counts_what_it_says() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(49))
    source = f"def short(self, a, b, *, c, d, e, f):\n{body}\n\ndef long(a, *args, **kwargs):\n{body}\n    x = 0\n"
    assert offenders(source, "s") == ["s:52 long: 51 lines"]
    assert offenders("def wide(a, b, c, d, e, f, *g):\n    pass\n", "s") == ["s:1 wide: 7 parameters"]
