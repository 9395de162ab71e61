"""Every writing ``tfrecordd state`` command is atomic: killed at any of its crash points
(``TFRECORDD_CRASH_AT``, :data:`tfrecordd.crashpoints.STATE_POINTS`), the state it leaves is
either untouched or a committed change that the rerun, ``state check`` and the daemon's start
all finish; rerun, it gives the state of an uninterrupted run, and the daemon started on it
writes every event as often as after an uninterrupted run (each once, but for a forgotten
source's inputs, which are read again from their start).

The kill instants are not listed: each point is armed for its 1st, 2nd, ... pass until the
command no longer reaches it, so a new step of a change is killed at as well."""

from __future__ import annotations

import ast
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.e2e.test_daemon_process import drained, fill_spool
from tests.support import DaemonProcess, read_ids, run_clean_until, run_tfrecordd, write_config
from tfrecordd.crashpoints import STATE_POINTS
from tfrecordd.state import change

OUTPUT = {"max_shard_records": 40, "max_shard_age": "200ms"}
DAEMON = {"max_batch_events": 20}


@dataclass(frozen=True)
class Scenario:
    """A state command, the state it runs on, and the config the daemon then runs with."""

    command: tuple[str, ...]
    source: str
    """The configured source's name (the template's is ``spool``)."""
    damage: str = ""
    """What is done to the template's state first: ``torn`` journal tail, or ``damaged``
    checkpoint and journal."""
    once: bool = True
    """Whether the daemon then writes every event once (not so for a forgotten source)."""
    last: str = "after-publish:3"
    """Where the template's second run is killed: ``after-publish`` leaves a commit whose acks
    are not done, ``after-done`` none."""


SCENARIOS = {
    "rename-source": Scenario(("rename-source", "spool", "inbox"), "inbox"),
    "rename-source-acked": Scenario(
        ("rename-source", "spool", "inbox"), "inbox", last="after-done:2"
    ),
    "forget-source": Scenario(("forget-source", "spool"), "inbox", once=False),
    "repair-torn": Scenario(("repair",), "spool", damage="torn"),
    "repair-discard": Scenario(("repair", "--discard-checkpoint"), "spool", damage="damaged"),
}


def _config(root: Path, source: str = "spool") -> Path:
    return write_config(root, output=OUTPUT, daemon=DAEMON, source={"name": source})


def _crash(cfg: Path, point: str) -> None:
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": point})
    assert d.wait(60) == 137, d.output()


@cache
def _template(base: Path, last: str) -> Path:
    """One half-read spool file whose source has positions everywhere a state command changes
    them: in the checkpoint (the first commits, folded), in finished commits of the journal
    after them, and (killed ``after-publish``) in a published commit whose acks are not
    done."""
    from tfrecordd.fsys import LOCAL
    from tfrecordd.state.journal import Journal
    from tfrecordd_plugins.sources.directory import DirectorySource

    root = base / f"template-{last}"
    root.mkdir()
    cfg = _config(root)
    fill_spool(root, 1, 400)
    _crash(cfg, "after-done:3")
    journal = Journal(str(root / "state"), LOCAL, {"spool": DirectorySource.fold})
    journal.recover()
    journal.compact()
    journal.close()
    _crash(cfg, last)
    (root / "state" / "sources" / "spool").mkdir(parents=True, exist_ok=True)
    (root / "state" / "sources" / "spool" / "own").write_bytes(b"a source's own file")
    return root


def _copy(base: Path, root: Path, scenario: Scenario) -> Path:
    """The scenario's template under ``root``, damaged as it says; the daemon's config."""
    shutil.copytree(_template(base, scenario.last), root, symlinks=True)
    cfg = _config(root, scenario.source)
    state = root / "state"
    if scenario.damage == "torn":
        journal = state / "journal"
        journal.write_bytes(journal.read_bytes() + b"\x30\x00\x00\x00\x00")
    elif scenario.damage == "damaged":
        (state / "checkpoint.json").write_bytes(b'{"vers')
        data = bytearray((state / "journal").read_bytes())
        data[20] ^= 0x40
        (state / "journal").write_bytes(bytes(data))
    return cfg


_TIME = re.compile(r"\.damaged-\d{8}T\d{6}(-\d+)?$")


def _snapshot(state: Path, *, hidden: bool = True) -> dict[str, bytes]:
    """Every file of ``state_dir`` but the lock, by path (an aside copy's time left out)."""
    return {
        _TIME.sub(".damaged-TIME", str(p.relative_to(state))): p.read_bytes()
        for p in sorted(state.rglob("*"))
        if p.is_file() and p.name != "lock" and (hidden or not p.name.startswith("."))
    }


def _state(cfg: Path, command: tuple[str, ...], crash: str | None = None) -> tuple[int, str]:
    env = None if crash is None else {**os.environ, "TFRECORDD_CRASH_AT": crash}
    done = run_tfrecordd("state", command[0], "--config", str(cfg), *command[1:], env=env)
    return done.returncode, done.stdout + done.stderr


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run of a scenario's command."""

    before: dict[str, bytes]
    check_before: int
    after: dict[str, bytes]
    check_after: int
    ids: Counter[int]


@cache
def _reference(base: Path, name: str) -> Reference:
    scenario = SCENARIOS[name]
    root = base / f"reference-{name}"
    cfg = _copy(base, root, scenario)
    before = _snapshot(root / "state")
    check_before = _state(cfg, ("check",))[0]
    rc, out = _state(cfg, scenario.command)
    assert rc == 0, out
    after = _snapshot(root / "state")
    check_after, out = _state(cfg, ("check",))
    assert check_after == 0, out
    run_clean_until(cfg, lambda: drained(root))
    ids = read_ids(root / "shards")
    assert set(ids) == set(range(400))
    if scenario.once:
        assert max(ids.values()) == 1
    return Reference(before, check_before, after, check_after, ids)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state-atomic")


@pytest.mark.parametrize("finish", ["rerun", "start"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_state_command_killed_at_any_point_is_finished_as_if_never_killed(
    base: Path, tmp_path: Path, name: str, finish: str
) -> None:
    """At each kill: either nothing changed (or all of it), or a change is committed whose
    finishing gives the uninterrupted run's state (and ``state check`` judges the state as it
    will be). Then the command is rerun (``rerun``), or the daemon is started at once
    (``start``: it finishes a committed change itself): the state, and the events the daemon
    writes, are those of an uninterrupted run."""
    scenario = SCENARIOS[name]
    ref = _reference(base, name)
    reached: Counter[str] = Counter()
    for point in STATE_POINTS:
        nth = 1
        while True:
            root = tmp_path / f"{point}-{nth}"
            cfg = _copy(base, root, scenario)
            state = root / "state"
            rc, out = _state(cfg, scenario.command, f"{point}:{nth}")
            if rc != 137:
                assert rc == 0, out
                assert _snapshot(state) == ref.after, f"{point}:{nth} not reached"
                break
            reached[point] += 1
            at = f"killed at {point}:{nth}"
            pending = (state / change.MARKER).exists()
            code, out = _state(cfg, ("check",))
            if pending:
                finished = tmp_path / "finished"
                shutil.copytree(state, finished, symlinks=True)
                change.finish(str(finished))
                assert _snapshot(finished) == ref.after, f"{at}: the committed change differs"
                shutil.rmtree(finished)
                assert code == ref.check_after, f"{at}: {out}"
                assert " ".join(scenario.command) in out, f"{at}: {out}"
            else:
                now = _snapshot(state, hidden=False)
                assert now in (ref.before, ref.after), f"{at}: changed, and nothing committed"
                assert code == (ref.check_before if now == ref.before else ref.check_after), out
            if finish == "rerun" or not pending:
                rc, out = _state(cfg, scenario.command)
                assert rc == 0, f"{at}, the rerun: {out}"
                assert _snapshot(state) == ref.after, f"{at}, the rerun: its state differs"
            if finish == "start" or point == STATE_POINTS[-1]:
                run_clean_until(cfg, lambda root=root: drained(root))
                assert read_ids(root / "shards") == ref.ids, f"{at}: events written differ"
            shutil.rmtree(root)
            nth += 1
    assert set(reached) == set(STATE_POINTS), f"points never reached: {reached}"


def test_a_damaged_change_marker_is_refused_by_every_reader(base: Path, tmp_path: Path) -> None:
    """The marker is written atomically, so a crash never tears it: one that does not read is
    damage, and neither a state command nor the daemon guesses what it meant."""
    scenario = SCENARIOS["rename-source"]
    cfg = _copy(base, tmp_path / "root", scenario)
    marker = tmp_path / "root" / "state" / change.MARKER
    marker.write_bytes(b'{"version": 1, "command": ["rename-source"], "steps": [["write"')
    for command in (("check",), scenario.command):
        rc, out = _state(cfg, command)
        assert rc == 65, out
        assert str(marker) in out
    d = DaemonProcess(cfg)
    assert d.wait(60) == 65, d.output()
    assert str(marker) in d.output()
    assert "Traceback" not in d.output()


def test_the_state_commands_write_state_dir_only_through_a_change() -> None:
    """No file of ``state_dir`` is written, renamed or removed by a state command but through
    :mod:`tfrecordd.state.change`, whose steps are committed at once and each killed at."""
    import tfrecordd.cli.statecmd as statecmd

    changing = {"rename", "replace", "link", "symlink", "unlink", "remove", "rmdir", "rmtree"}
    changing |= {"mkdir", "makedirs", "truncate", "ftruncate", "open", "write", "move"}
    found = []
    for node in ast.walk(ast.parse(Path(statecmd.__file__).read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            hit = func.id in ("open", "write_atomically", "write_file")
        elif isinstance(func, ast.Attribute):
            module = func.value.id if isinstance(func.value, ast.Name) else ""
            hit = func.attr in ("write_bytes", "write_text", "write_atomically", "write_file")
            hit = hit or (module in ("os", "shutil", "LOCAL") and func.attr in changing)
        else:
            hit = False
        if hit:
            found.append(f"line {node.lineno}: {ast.unparse(func)}")
    assert found == []
