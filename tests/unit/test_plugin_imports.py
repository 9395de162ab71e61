"""The plugin boundary: the built-in plugins (``plugins/``) and the example out-of-tree plugin
(``examples/``) import from tfrecordd only its documented plugin surface, ``tfrecordd.plugin``,
the format API ``tfrecordd.format.*`` and the schema API ``tfrecordd.schema.*`` (imports inside
functions and under ``TYPE_CHECKING`` count too), as CONTRIBUTING.md's "Adding a plugin" says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_ROOTS = [REPO / "plugins", REPO / "examples"]

SURFACE = ("tfrecordd.plugin", "tfrecordd.format", "tfrecordd.schema")
"""What a plugin may import from tfrecordd: these modules and their submodules."""

TEMPORARY: dict[str, set[str]] = {}
"""Imports outside the surface still allowed, by file, each while another change removes it."""


def _files() -> list[Path]:
    return sorted(p for root in PLUGIN_ROOTS for p in root.rglob("*.py") if "build" not in p.parts)


def _tfrecordd_imports(source: str) -> set[str]:
    """Every ``tfrecordd`` module a source file imports, as ``tfrecordd.X[.Y]`` (``from
    tfrecordd import X`` counts as importing ``tfrecordd.X``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "tfrecordd":
                names = [f"tfrecordd.{a.name}" for a in node.names]
            else:
                names = [node.module]
        else:
            continue
        found |= {n for n in names if n == "tfrecordd" or n.startswith("tfrecordd.")}
    return found


def _outside(imports: set[str]) -> set[str]:
    return {m for m in imports if not any(m == s or m.startswith(s + ".") for s in SURFACE)}


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_plugin_imports_only_the_plugin_surface(path: Path) -> None:
    rel = str(path.relative_to(REPO))
    outside = _outside(_tfrecordd_imports(path.read_text()))
    allowed = TEMPORARY.get(rel, set())
    assert outside <= allowed, (
        f"{rel} imports beyond the plugin surface: {sorted(outside - allowed)}"
    )
    assert allowed <= outside, f"{rel} no longer needs {sorted(allowed - outside)}: drop it"


def test_the_check_sees_every_kind_of_import() -> None:
    source = (
        "import tfrecordd.fsys\n"
        "from tfrecordd import crashpoints, plugin\n"
        "from tfrecordd.state import statelock\n"
        "from tfrecordd.format.wire import x\n"
        "from tfrecordd_plugins.sources import y\n"
        "if TYPE_CHECKING:\n    from tfrecordd._cframe import z\n"
        "def f():\n    from tfrecordd.errors import E\n"
    )
    assert _outside(_tfrecordd_imports(source)) == {
        "tfrecordd.fsys",
        "tfrecordd.crashpoints",
        "tfrecordd.state",
        "tfrecordd._cframe",
        "tfrecordd.errors",
    }
    assert len(_files()) > 20
