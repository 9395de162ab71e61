"""Shared fixtures, the markers' switches, and the tiers' markers (tests/tiers.py)."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from typing import Any

import pytest

from tests.support import CLOSE_CALLS
from tests.tiers import group, group_of, needs


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run the long (slow) tests")


def pytest_configure(config: pytest.Config) -> None:
    # The long mode of the hostile-input properties is a hypothesis profile, chosen when the
    # test modules are imported: --run-slow selects it unless a profile is named already.
    if config.getoption("--run-slow"):
        os.environ.setdefault("TFRECORDD_HYPOTHESIS_PROFILE", "reliability-long")
    if not hasattr(config, "workerinput"):  # the controller; xdist's workers inherit it
        fd, notes = tempfile.mkstemp(prefix="tfrecordd-close-calls-")
        os.close(fd)
        os.environ[CLOSE_CALLS] = notes


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """List the waits that passed past :data:`~tests.support.CLOSE_CALL` of their timeout:
    the tests that will time out first on a slower machine."""
    if hasattr(config, "workerinput") or not (notes := os.environ.get(CLOSE_CALLS)):
        return
    try:
        with open(notes) as f:
            calls = [json.loads(line) for line in f]
        os.unlink(notes)
    except FileNotFoundError:
        return
    if calls:
        terminalreporter.section("waits that took more than half their timeout")
        for c in sorted(calls, key=lambda c: -c["took"] / c["timeout"]):
            terminalreporter.write_line(f"{c['took']:.1f} s of {c['timeout']:g}: {c['test']}")


# First: pytest-xdist's worker reads the xdist_group markers in its own hook of this name,
# registered after this conftest and so called before it; the groups were never applied.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(needs(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
        if (together := group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(together))
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long mode: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups of tests/tiers.py read from the node ids: with
    pytest 9.2, pytest-xdist 3.8's own grouping (an ``@group`` suffix written into each node id
    by the worker) no longer takes, and every test was scheduled on its own
    (pytest-dev/pytest-xdist#1386)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    # xdist ships no type information: its class is reached as Any, and extended by type().
    base: Any = importlib.import_module("xdist.scheduler").LoadGroupScheduling
    root = config.rootpath

    def split_scope(self: Any, nodeid: str) -> str:
        together = group_of(root / nodeid.partition("::")[0])
        return together if together is not None else str(base._split_scope(self, nodeid))

    return type("TierGroups", (base,), {"_split_scope": split_scope})(config, log)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
