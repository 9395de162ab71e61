"""What a test needs, read from where it lives and what it uses: the tiers' markers.

``tests/conftest.py`` applies these to every collected test, so ``pytest -m "not redis"`` (or
``not s3``, ``not tensorflow``, ``not subprocess``) selects what a machine can run. A test may
also carry a marker by hand (``tensorflow`` is set that way, by the tests that import it).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

FIXTURE_MARKS: dict[str, str] = {
    "redis_server": "redis",
    "s3_server": "s3",
    "s3_bucket": "s3",
    "tf": "tensorflow",
}
"""What a test needs because it uses a fixture that starts it."""

SPAWNS = re.compile(
    r"^\s*(?:import|from) (?:subprocess|multiprocessing|pty)\b"
    r"|\b(?:DaemonProcess|daemon_process|run_clean_until|run_tfrecordd|sys\.executable)\b"
    r"|^from tests\.reliability\.harness import"
    r"|^from tfrecordd\.pipeline(?:\.workers import| import workers)",
    re.MULTILINE,
)
"""A module that starts processes (the daemon, a command, encode workers, a tool): all its
tests are marked ``subprocess``."""

SERVERS = re.compile(r"\b(?:redis_server|RedisServer|running_redis|s3_server|running_s3)\b")
"""A module that starts a redis-server or an S3 server."""


KILL_TIMING = frozenset(
    {
        "reliability/test_crash_harness.py",
        "reliability/test_overload.py",
        "reliability/test_shutdown.py",
    }
)
"""Modules whose tests time signals against a loaded daemon (SIGKILL at forced phases, SIGTERM
trials, twice the output's rate): under pytest-xdist they share one worker (``--dist
loadgroup``), so no two of them load the machine at once."""

KILL_TIMING_GROUP = "kill-timing"

TENSORFLOW_GROUP = "tensorflow"
"""The group of the modules that import TensorFlow into the test process (it costs seconds of
CPU and hundreds of MB in each worker that does): they share one worker."""
IMPORTS_TENSORFLOW = re.compile(
    r"""importorskip\(\s*["']tensorflow["']\s*\)|^\s*import tensorflow\b""", re.MULTILINE
)


UNIT = "unit"
"""The folder of the tests that need only Python and the package: no process, no server."""


@cache
def spawns(path: Path) -> bool:
    """Whether the test module at ``path`` starts processes."""
    return SPAWNS.search(path.read_text()) is not None


def needs(item: pytest.Item) -> set[str]:
    """The markers of what ``item`` needs, from its module and its fixtures."""
    marks = {m for f, m in FIXTURE_MARKS.items() if f in getattr(item, "fixturenames", ())}
    if item.path.suffix == ".py" and spawns(item.path):
        marks.add("subprocess")
    return marks


def group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in, if any."""
    return group_of(item.path)


def group_of(module: Path) -> str | None:
    """The xdist group the tests of the module at ``module`` must run in, if any."""
    module = module.resolve()
    if not module.is_relative_to(TESTS):
        return None
    if module.relative_to(TESTS).as_posix() in KILL_TIMING:
        return KILL_TIMING_GROUP
    return TENSORFLOW_GROUP if imports_tensorflow(module) else None


@cache
def imports_tensorflow(path: Path) -> bool:
    """Whether the test module at ``path`` imports TensorFlow into the test process (read once:
    the scheduler asks for every test's group)."""
    return path.suffix == ".py" and IMPORTS_TENSORFLOW.search(path.read_text()) is not None
