"""The compiled hot path is found where it was built, and can be turned off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfrecordd import speedups


def test_required_extensions_are_built() -> None:
    # scripts/test.sh sets this: CI must never pass on the fallback alone because a build failed.
    if os.environ.get("TFRECORDD_REQUIRE_SPEEDUPS") != "1":
        pytest.skip("TFRECORDD_REQUIRE_SPEEDUPS=1 is not set")
    assert speedups.status() == dict.fromkeys(speedups.EXTENSIONS, True)


def test_pure_python_switch_turns_every_extension_off() -> None:
    code = "from tfrecordd import speedups; print(sorted(speedups.status().items()))"
    env = {**os.environ, "TFRECORDD_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(sorted(dict.fromkeys(speedups.EXTENSIONS, False).items()))


def test_unknown_extension_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown extension"):
        speedups.load("_nope")


@pytest.mark.parametrize("pure", ["0", "1"])
def test_plugins_command_tells_whether_each_extension_is_in_use(pure: str) -> None:
    env = {**os.environ, "TFRECORDD_PURE_PYTHON": pure}
    out = subprocess.run(
        [sys.executable, "-m", "tfrecordd", "plugins"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    section = out.split("compiled hot path:\n")[1].splitlines()[: len(speedups.EXTENSIONS)]
    for name, line in zip(speedups.EXTENSIONS, section, strict=True):
        words = line.split()
        assert words[0] == f"tfrecordd.{name}"
        if pure == "1":
            assert words[1:] == ["off", "(TFRECORDD_PURE_PYTHON)"]
        else:
            assert words[1:] == (["in", "use"] if speedups.load(name) else ["not", "built"])
