"""Shared fixtures, the markers' switches, and the tiers' markers (tests/tiers.py)."""

from __future__ import annotations

import os

import pytest

from tests.tiers import group, needs


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run the long (slow) tests")


def pytest_configure(config: pytest.Config) -> None:
    # The long mode of the hostile-input properties is a hypothesis profile, chosen when the
    # test modules are imported: --run-slow selects it unless a profile is named already.
    if config.getoption("--run-slow"):
        os.environ.setdefault("TFRECORDD_HYPOTHESIS_PROFILE", "reliability-long")


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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
