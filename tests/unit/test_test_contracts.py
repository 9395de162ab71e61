"""The tests hold the code to what it promises, through its public names: no test imports or
reaches into a private name (``_x``) of another module or of an object it did not make, so a
refactor that keeps the public behaviour keeps the suite green."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

EXTENSIONS = {"tfrecordd._cframe", "tfrecordd._cexample"}
"""The C extensions: private by name so that code reaches them through their typed facades, but
their own tests (and the tests that hold them to the pure-Python twins) import them."""

NOT_OURS = {
    "_exit",  # os._exit: a child that must not run the parent's clean-up
    "_getframe",
    "_replace",  # NamedTuple's public API, named with a leading underscore
    "_asdict",
    "_fields",
    "_SubParsersAction",  # argparse exposes its subcommands only this way
    "_choices_actions",
    "_actions",
    "_split_scope",  # pytest-xdist's scheduler: the hook conftest.py extends (xdist#1386)
}
"""Names of the standard library and the test tools that a test has to use despite the
underscore (the rule is about tfrecordd's own modules)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(path: Path) -> list[str]:
    """Each private name of another module that ``path`` imports or reaches into."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(TESTS.parent) if path.is_relative_to(TESTS.parent) else path
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if _private(alias.name) and full not in EXTENSIONS:
                    found.append(f"{where}:{node.lineno}: from {module} import {alias.name}")
            if any(_private(part) for part in module.split(".")) and module not in EXTENSIONS:
                found.append(f"{where}:{node.lineno}: from {module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(_private(p) for p in parts) and alias.name not in EXTENSIONS:
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in NOT_OURS:
                continue
            if (
                ast.unparse(node) in EXTENSIONS
                or ast.unparse(owner) in EXTENSIONS
                or (isinstance(owner, ast.Name) and f"tfrecordd.{owner.id}" in EXTENSIONS)
            ):
                continue  # a name of an extension's own interface (its .pyi)
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_test_reaches_a_private_name_of_another_module() -> None:
    found = [v for path in sorted(TESTS.rglob("*.py")) for v in violations(path)]
    assert found == []


def test_the_check_finds_each_way_of_reaching_a_private_name(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import tfrecordd._hidden\n"
        "from tfrecordd.pipeline.workers import _Pending\n"
        "from tfrecordd import _cframe\n"
        "_cframe._crc32c_portable(b'')\n"
        "import tfrecordd\n"
        "tfrecordd._cexample.ExamplePlan\n"
        "from tfrecordd.format import framing\n"
        "framing._frame_many_py\n"
        "from tfrecordd.fsys import FileSystem\n"
        "fs = FileSystem()\n"
        "fs._fault = 1\n"
        "self._mine = 2\n"
        "t = (1,)._replace\n"
    )
    found = violations(sample)
    assert [f.split(": ", 1)[1] for f in found] == [
        "import tfrecordd._hidden",
        "from tfrecordd.pipeline.workers import _Pending",
        "framing._frame_many_py",
        "fs._fault",
    ]
