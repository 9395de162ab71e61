"""The suite's daemons, forked from a warm interpreter (tests/launcher.py), behave as cold
``python -m tfrecordd run`` processes do in everything the tests look at: exit statuses, signals,
crash points armed from the environment, their own session, their log, their environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launcher import (
    LAUNCHER,
    PARENT_ENV,
    LaunchedProcess,
    TemplateLost,
    enabled,
    forkable,
)
from tests.support import (
    DaemonProcess,
    movie_event,
    read_ids,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)


def test_what_is_read_at_import_time_decides_a_cold_start() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/x", "TFRECORDD_REQUIRE_SPEEDUPS": "1"}
    assert forkable(base, base)
    assert forkable(base | {"TFRECORDD_CRASH_AT": "after-intent:2", "NOTIFY_SOCKET": "/s"}, base)
    assert forkable(base | {"PYTHONUNBUFFERED": "1"}, base)
    assert not forkable(base | {"TFRECORDD_PURE_PYTHON": "1"}, base)
    assert not forkable(base | {"PYTHONPATH": "/y"}, base)
    assert not forkable(base | {"MALLOC_TOP_PAD_": "0"}, base)
    assert not forkable({k: v for k, v in base.items() if k != "PYTHONPATH"}, base)


@pytest.mark.parametrize("cold", [False, True], ids=["forked", "cold"])
def test_a_daemon_runs_stops_and_crashes_as_a_cold_one_does(tmp_path: Path, cold: bool) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(50)])
    d = DaemonProcess(cfg, cold=cold)
    try:
        assert isinstance(d.proc, LaunchedProcess) is (enabled() and not cold)
        d.wait_started()
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 50, 60)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert " started: " in d.output()

    # The crash point comes from the environment of this start, not the template's.
    spool_file(tmp_path / "spool", "b.jsonl", [movie_event(i) for i in range(50, 60)])
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent"}, cold=cold)
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()

    d = DaemonProcess(cfg, own_group=True, cold=cold)
    try:
        d.wait_started()
        assert os.getpgid(d.proc.pid) == d.proc.pid
        assert os.getsid(d.proc.pid) == d.proc.pid
        d.interrupt_group()
        assert d.wait(60) == 0, d.output()
    finally:
        d.kill()

    d = DaemonProcess(cfg, cold=cold)
    try:
        d.wait_started()
        d.proc.send_signal(signal.SIGKILL)
        assert d.wait(30) == -signal.SIGKILL
        assert d.proc.returncode == -signal.SIGKILL
    finally:
        d.kill()
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "spool"))
    ids = read_ids(tmp_path / "shards")
    assert set(ids) == set(range(60))
    assert set(ids.values()) == {1}


FORKING = pytest.mark.skipif(not enabled(), reason="TFRECORDD_TEST_FORK=0: nothing is forked")


@FORKING
def test_a_config_error_is_the_daemons_exit_status(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"compression": "lz4"})
    d = DaemonProcess(cfg)
    assert isinstance(d.proc, LaunchedProcess)
    assert d.wait(30) == 78
    assert "output.compression" in d.output()
    assert LAUNCHER.forkable(dict(os.environ))


def test_what_a_start_cannot_set_up_is_raised_in_the_test(tmp_path: Path) -> None:
    """As ``Popen`` raises it: the working directory that is not there, say."""
    with pytest.raises(FileNotFoundError):
        run_tfrecordd("--version", cwd=tmp_path / "nowhere")
    # The template is still there for the next one.
    assert run_tfrecordd("--version", cwd=tmp_path).returncode == 0


@FORKING
def test_a_dead_template_is_reported_not_waited_for(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        assert isinstance(d.proc, LaunchedProcess)
        os.kill(LAUNCHER.template().pid, signal.SIGKILL)
        with pytest.raises(TemplateLost, match=f"pid {d.proc.pid} died"):
            wait_for(lambda: d.proc.poll() is not None, 10)
    finally:
        os.kill(d.proc.pid, signal.SIGKILL)
    # The next start has a template of its own.
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        assert d.stop() == 0, d.output()
    finally:
        d.kill()


def test_a_command_runs_to_its_end_with_its_output_and_errors_apart(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    ok = run_tfrecordd("check-config", cfg.name, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert f"{cfg.name}: OK" in ok.stdout
    assert ok.stderr == ""
    missing = run_tfrecordd("check-config", "nowhere.toml", cwd=tmp_path)
    assert missing.returncode == 66  # EX_NOINPUT: no config was read
    assert "nowhere.toml" in missing.stderr
    assert missing.stdout == ""
    cold = run_tfrecordd(
        "check-config", cfg.name, cwd=tmp_path, env=dict(os.environ) | {"PYTHONPATH": "/x"}
    )
    assert (cold.returncode, cold.stdout) == (ok.returncode, ok.stdout)


def test_a_template_whose_test_run_dies_ends(tmp_path: Path) -> None:
    """A test run killed while a process it started holds the template's stdin open: the
    template must not poll for ever (left behind, each burned a fifth of a core)."""
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import os, signal, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import tests.launcher as l; "
        "raise SystemExit(l.serve())'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, "
        f"env=os.environ | {{{PARENT_ENV!r}: str(os.getpid())}}, "
        f"stderr=subprocess.DEVNULL, cwd={str(Path(__file__).resolve().parents[2])!r})\n"
        "assert p.stdin is not None\n"
        "s = subprocess.Popen(['sleep', '120'], pass_fds=(p.stdin.fileno(),), "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, s.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, str(parent)], capture_output=True, timeout=60)
    template, holder = (int(pid) for pid in out.stdout.split())
    try:
        deadline = time.monotonic() + 30  # the template warms up (imports) first
        while time.monotonic() < deadline:
            try:
                if Path(f"/proc/{template}/stat").read_text().split(")")[-1].split()[0] == "Z":
                    return  # ended, not yet reaped by init
            except FileNotFoundError:
                return
            time.sleep(0.05)
        os.kill(template, signal.SIGKILL)
        raise AssertionError("the template outlived its test run")
    finally:
        os.kill(holder, signal.SIGKILL)
