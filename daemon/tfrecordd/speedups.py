"""The compiled hot path, where the install built it.

``setup.py`` builds each C extension as optional: without a C compiler tfrecordd installs and
runs the pure-Python code that the extensions stand in for, byte for byte the same, only slower.
:func:`load` finds an extension; it returns ``None`` when the extension is missing or when
``TFRECORDD_PURE_PYTHON=1`` is set (to rule the compiled code out when chasing a problem, and for
the tests that hold both paths to the same output). Code calls ``_cframe`` only through the typed
functions of :mod:`tfrecordd.format.compiled`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["EXTENSIONS", "PURE_PYTHON", "load", "status"]

EXTENSIONS = ("_cframe", "_cexample")
"""The extension modules ``setup.py`` builds, by their name inside the package."""

PURE_PYTHON = os.environ.get("TFRECORDD_PURE_PYTHON", "") not in ("", "0")
"""Whether ``TFRECORDD_PURE_PYTHON`` turned the compiled code off for this process."""


def load(name: str) -> ModuleType | None:
    """The extension ``name`` (one of :data:`EXTENSIONS`), or ``None`` to use pure Python."""
    if name not in EXTENSIONS:
        raise ValueError(f"unknown extension {name!r}")
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(f"tfrecordd.{name}")
    except ImportError:
        return None


def status() -> dict[str, bool]:
    """Each extension's name → whether this process uses it."""
    return {name: load(name) is not None for name in EXTENSIONS}
