"""The unit tier needs only Python and the package: no process, no server (tests/tiers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiers import (
    KILL_TIMING,
    KILL_TIMING_GROUP,
    SERVERS,
    TENSORFLOW_GROUP,
    TESTS,
    UNIT,
    group_of,
    spawns,
)

UNIT_MODULES = sorted((TESTS / UNIT).glob("test_*.py"))


def test_the_unit_tier_is_found() -> None:
    assert len(UNIT_MODULES) > 10


@pytest.mark.parametrize("path", UNIT_MODULES, ids=lambda p: p.name)
def test_unit_tests_start_no_process_and_no_server(path: Path) -> None:
    assert not spawns(path), f"{path.name} starts processes: it belongs in integration/ or e2e/"
    assert SERVERS.search(path.read_text()) is None, f"{path.name} starts a server"


def test_the_rules_see_what_they_look_for() -> None:
    assert spawns(TESTS / "e2e" / "test_daemon_process.py")
    assert spawns(TESTS / "integration" / "test_workers.py")
    assert not spawns(TESTS / "unit" / "test_journal.py")
    assert SERVERS.search((TESTS / "integration" / "test_redis_source.py").read_text())


@pytest.mark.parametrize("module", sorted(KILL_TIMING))
def test_the_kill_timing_group_names_modules_that_exist(module: str) -> None:
    assert (TESTS / module).is_file()


def test_the_group_is_found_from_a_module_path_as_a_node_id_gives_it() -> None:
    """The scheduler (tests/conftest.py) sees node ids, not items: the rootdir joined with the
    module part of a node id names the group."""
    for module in KILL_TIMING:
        assert group_of(TESTS.parent / "tests" / module) == KILL_TIMING_GROUP
    assert group_of(TESTS / "unit" / "test_journal.py") is None
    assert group_of(TESTS.parent / "scripts" / "crash_harness.py") is None
    # TensorFlow's in-process users share a worker; a kill-timing module stays in its group.
    assert group_of(TESTS / "e2e" / "test_tf_interop_encoding.py") == TENSORFLOW_GROUP
    assert group_of(TESTS / "unit" / "test_framing.py") == TENSORFLOW_GROUP
    assert group_of(TESTS / "reliability" / "test_crash_harness.py") == KILL_TIMING_GROUP
