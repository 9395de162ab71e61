"""No Python module of the package or the built-in plugins is over 500 lines: a module that grows
past that holds more than one job, and is split along its seams (CONTRIBUTING.md names each
module's job)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
ALLOWED: dict[str, str] = {}
"""Modules over the limit for now, with why. Remove an entry once its module is within it."""


def _sizes() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for root in ("daemon", "plugins")
        for path in sorted((ROOT / root).rglob("*.py"))
    }


def test_no_module_is_over_the_limit() -> None:
    sizes = _sizes()
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in ALLOWED}
    assert over == {}, f"over {MAX_LINES} lines: split each along its seams"


def test_every_allowance_is_still_needed() -> None:
    sizes = _sizes()
    stale = [name for name in ALLOWED if sizes.get(name, 0) <= MAX_LINES]
    assert stale == [], "within the limit now (or gone): remove from ALLOWED"


def test_the_count_sees_the_modules() -> None:
    sizes = _sizes()
    assert "daemon/tfrecordd/plugin.py" in sizes
    assert "plugins/tfrecordd_plugins/encoders/example.py" in sizes
    assert sizes["daemon/tfrecordd/plugin.py"] == (
        ROOT / "daemon/tfrecordd/plugin.py"
    ).read_text().count("\n")
