"""The package's layers, as README's Development section and CONTRIBUTING.md draw them: a module
imports only from its own layer or the ones below, and no import cycle exists anywhere (imports
inside functions count: they are how cycles hide)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "daemon"

LAYERS: list[tuple[str, set[str]]] = [
    (
        "base",
        {
            "tfrecordd",
            "tfrecordd.errors",
            "tfrecordd.redact",
            "tfrecordd.secretvalues",
            "tfrecordd.units",
            "tfrecordd.fsys",
            "tfrecordd.crashpoints",
            "tfrecordd.heap",
            "tfrecordd.descriptors",
            "tfrecordd.logs",
            "tfrecordd.notify",
            "tfrecordd.endpoints",
            "tfrecordd.progress",
            "tfrecordd.retry",
            "tfrecordd.speedups",
            "tfrecordd._cframe",
            "tfrecordd._cexample",
        },
    ),
    ("format", {"tfrecordd.format"}),
    ("schema", {"tfrecordd.schema"}),
    (
        "plugin toolkit and config",
        {
            "tfrecordd.plugin",
            "tfrecordd.boundary",
            "tfrecordd.events",
            "tfrecordd.testing",
            "tfrecordd.config",
            "tfrecordd.datasets",
            "tfrecordd.pathcheck",
            "tfrecordd.metrics",
            "tfrecordd.configref",
            "tfrecordd.interpolate",
            "tfrecordd.showconfig",
            "tfrecordd.startcheck",
            "tfrecordd.suggest",
        },
    ),
    ("state", {"tfrecordd.state"}),
    ("outputs", {"tfrecordd.outputs"}),
    ("pipeline", {"tfrecordd.pipeline"}),
    ("convert", {"tfrecordd.convert"}),
    ("cli", {"tfrecordd.cli", "tfrecordd.__main__", "tfrecordd.reader", "tfrecordd.readers"}),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "tfrecordd").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
_TYPE_CHECKING = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
"""Imports under ``if TYPE_CHECKING:`` are for annotations only and never run."""


def _layer(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or (p != "tfrecordd" and module.startswith(p + ".")):
                best = i
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to the docs)")
    return best


@cache
def _imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports at run time (parsed when first asked: not
    while the suite is collected, in every worker)."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING
        for n in ast.walk(block)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from package import module`` depends on that module; ``from module import name``
            # on the module.
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        else:
            continue
        for name in names:
            # the longest known module the name starts with (``from x import y`` may name a
            # module or an attribute)
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("tfrecordd"):
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    return {m: _imports(m) for m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_layer_and_the_ones_below(module: str) -> None:
    mine = _layer(module)
    upward = sorted(d for d in _imports(module) if _layer(d) > mine and d != "tfrecordd")
    assert upward == [], (
        f"{module} ({LAYERS[mine][0]}) imports from a layer above it: "
        + ", ".join(f"{d} ({LAYERS[_layer(d)][0]})" for d in upward)
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w == "tfrecordd":
                continue  # the package's __init__ re-exports the errors and imports nothing else
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


def test_there_is_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_checks_can_fail() -> None:
    """An import from the cli into the format layer would be upward; modules importing each
    other, directly or around a loop, are a cycle."""
    assert _layer("tfrecordd.cli.tools") > _layer("tfrecordd.format.reader")
    assert "tfrecordd.format.framing" in _imports("tfrecordd.format.reader")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
