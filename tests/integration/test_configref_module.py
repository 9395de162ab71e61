"""``python -m tfrecordd.configref`` prints the config reference the docs are checked against."""

from __future__ import annotations

import subprocess
import sys

from tfrecordd.configref import render


def test_module_prints_the_reference() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfrecordd.configref"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout == render()
