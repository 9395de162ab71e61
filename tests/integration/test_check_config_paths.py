"""What the machine does to a valid config, told by ``check-config`` before and by ``run`` at
start as one line with its exit status: a folder it cannot write in (74), a listen address in
use (75), a spool that does not exist (a warning), a rename across file systems (74).

A read-only folder is made as the test's user allows: ``chmod 0555`` for a user, a read-only
bind mount in a mount namespace of its own (``unshare -m``) for root, whom modes do not stop."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import (
    daemon_process,
    free_port,
    run_tfrecordd,
    wait_for,
    write_config,
    write_tcp_config,
)
from tfrecordd.errors import EXIT_CONFIG, EXIT_IN_USE, EXIT_IO

TIMEOUT = 90


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


def run_with(
    args: Sequence[str], *, readonly: Sequence[Path] = (), tmpfs: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m tfrecordd ARGS`` with each of ``readonly`` read-only and a fresh file system
    mounted on each of ``tmpfs``."""
    argv = [sys.executable, "-m", "tfrecordd", *args]
    if os.geteuid() != 0 and not tmpfs:
        for folder in readonly:
            folder.chmod(0o555)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        finally:
            for folder in readonly:
                folder.chmod(0o755)
    if os.geteuid() != 0 or not _can_unshare():
        pytest.skip(
            "needs a read-only folder or a mount: chmod does not stop root, and unshare -m "
            "(a mount namespace of the test's own) is not available here"
        )
    mounts = [f"mount --bind -o ro {shlex.quote(str(f))} {shlex.quote(str(f))}" for f in readonly]
    mounts += [f"mount -t tmpfs tfrecordd-test {shlex.quote(str(f))}" for f in tmpfs]
    script = " && ".join([*mounts, 'exec "$@"'])
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback TCP port this test listens on."""
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield port


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1]


def test_check_config_warns_of_a_spool_that_does_not_exist_and_run_warns_at_start(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, source={"path": tmp_path / "spoool"})
    assert not (tmp_path / "spoool").exists()
    result = run_tfrecordd("check-config", str(config))
    assert result.returncode == 0, result.stderr
    assert f"warning: sources[0].path: {tmp_path / 'spoool'} does not exist" in result.stderr
    with daemon_process(config) as daemon:
        daemon.wait_started()
        assert daemon.stop() == 0
        warnings = [line for line in daemon.output().splitlines() if "does not exist" in line]
    assert len(warnings) == 1
    assert "WARNING" in warnings[0]
    assert "sources[0].path" in warnings[0]


def test_check_config_warns_of_a_metrics_port_in_use_and_run_exits_75(tmp_path: Path) -> None:
    with held_port() as port:
        config = write_config(tmp_path, metrics_port=port)
        result = run_tfrecordd("check-config", str(config))
        assert result.returncode == 0, result.stderr
        assert f"warning: metrics.listen: 127.0.0.1:{port}: address already in use" in (
            result.stderr
        )
        run = run_with(["run", "--config", str(config)])
    assert run.returncode == EXIT_IN_USE, run.stderr
    line = _one_line(run.stderr)
    assert f"metrics.listen: 127.0.0.1:{port}: address already in use" in line


def test_a_read_only_state_dir_is_one_line_and_exit_74(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    for command in (["check-config", str(config)], ["run", "--config", str(config)]):
        result = run_with(command, readonly=[state])
        assert result.returncode == EXIT_IO, result.stderr
        assert f"daemon.state_dir: {state} is not writable" in _one_line(result.stderr)
    offline = run_with(["check-config", "--config-only", str(config)], readonly=[state])
    assert offline.returncode == 0, offline.stderr


def test_a_read_only_output_directory_is_one_line_and_exit_74(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    shards = tmp_path / "shards"
    shards.mkdir()
    for command in (["check-config", str(config)], ["run", "--config", str(config)]):
        result = run_with(command, readonly=[shards])
        assert result.returncode == EXIT_IO, result.stderr
        assert f"output.dir: {shards} is not writable" in _one_line(result.stderr)


def test_a_staging_folder_on_another_file_system_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    staging = tmp_path / "shards" / ".unpublished"
    staging.mkdir(parents=True)
    result = run_with(["check-config", str(config)], tmpfs=[staging])
    assert result.returncode == EXIT_IO, result.stderr
    assert "output.dir: " in result.stderr
    assert "another file system" in result.stderr


def _run_until(config: Path, flags: Sequence[str], seen: str, log: Path) -> str:
    """``run`` until its log holds ``seen``, then SIGTERM; its log."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfrecordd", "run", "--config", str(config), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: seen in log.read_text() or proc.poll() is not None, timeout=60)
        assert seen in log.read_text(), log.read_text()
        time.sleep(0.5)  # the signal handlers are installed once the pipeline runs
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait(30)
    return log.read_text()


def test_the_log_level_is_a_config_key_and_the_flag_wins(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, daemon={"log_level": "warning"}, source={"path": tmp_path / "no-spool"}
    )
    quiet = _run_until(config, [], "does not exist", tmp_path / "quiet.log")
    assert " INFO " not in quiet
    loud = _run_until(config, ["--log-level", "info"], " started: ", tmp_path / "loud.log")
    assert " INFO " in loud


def test_a_source_port_in_use_is_one_line_naming_its_key_and_exit_75(tmp_path: Path) -> None:
    with held_port() as port:
        config = write_tcp_config(tmp_path, port)
        check = run_tfrecordd("check-config", str(config))
        assert check.returncode == 0, check.stderr
        assert f"warning: sources[0].listen: 127.0.0.1:{port}: address already in use" in (
            check.stderr
        )
        run = run_with(["run", "--config", str(config)])
    assert run.returncode == EXIT_IN_USE, run.stderr
    assert f"stopping: sources[0].listen: 127.0.0.1:{port}: " in _one_line(run.stderr)


def test_a_write_refused_while_running_names_the_key_of_its_innermost_folder(
    tmp_path: Path,
) -> None:
    """A folder that turns read-only after the start: the OSError the runtime meets, inside a
    task group's exception group, is told with the key of the folder that holds its path (an
    output inside ``state_dir`` is the output's)."""
    from tfrecordd.config import load_config
    from tfrecordd.startcheck import explain

    state = tmp_path / "state"
    config = load_config(write_config(tmp_path, output={"dir": state / "shards"}))
    staging = state / "shards" / ".unpublished"
    for where, key in ((staging, "output.dir"), (state / "journal", "daemon.state_dir")):
        refused = OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
        problem = explain(BaseExceptionGroup("unhandled errors in a TaskGroup", [refused]), config)
        assert problem is not None
        assert problem.exit_code == EXIT_IO
        assert str(problem) == f"{key}: {where}: Read-only file system"
    unrelated = OSError(errno.EROFS, os.strerror(errno.EROFS), "/somewhere/else")
    assert explain(BaseExceptionGroup("unhandled", [unrelated]), config) is None


def test_a_metrics_address_not_of_this_machine_is_one_line_and_exit_78(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, metrics_port=port)
    # TEST-NET-1 (RFC 5737): an address no machine here has.
    config.write_text(config.read_text().replace(f"127.0.0.1:{port}", "192.0.2.1:9777"))
    check = run_tfrecordd("check-config", str(config))
    assert check.returncode == 0, check.stderr
    assert "warning: metrics.listen: 192.0.2.1:9777: not an address of this machine" in (
        check.stderr
    )
    run = run_with(["run", "--config", str(config)])
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "metrics.listen: 192.0.2.1:9777: not an address of this machine" in _one_line(run.stderr)


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_a_source_address_not_of_this_machine_is_one_line_and_exit_78(
    tmp_path: Path, kind: str
) -> None:
    """As for the metrics address: not "in use" (75), which a later start may find free, but
    the config's to fix."""
    config = write_tcp_config(tmp_path, 9778, kind=kind, host="192.0.2.1")
    run = run_with(["run", "--config", str(config)])
    assert run.returncode == EXIT_CONFIG, run.stderr
    line = _one_line(run.stderr)
    assert "sources[0].listen: 192.0.2.1:9778: cannot listen: not an address of this machine" in (
        line
    )


def test_a_unix_socket_in_a_folder_not_there_is_one_line_and_exit_78(tmp_path: Path) -> None:
    """The same class: where the socket cannot be made is the config's to fix."""
    where = tmp_path / "no-such-folder" / "in.sock"
    config = write_config(tmp_path, source={"name": "in", "type": "unix", "path": where})
    run = run_with(["run", "--config", str(config)])
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert f"sources[0].path: {where}: cannot listen: its folder is not there" in (
        _one_line(run.stderr)
    )


def test_check_config_beside_its_running_daemon_warns_of_no_port(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, metrics_port=port)
    with daemon_process(config) as daemon:
        daemon.wait_started(60)
        check = run_tfrecordd("check-config", str(config))
    assert check.returncode == 0, check.stderr
    assert "already in use" not in check.stderr
    assert f"the daemon (PID {daemon.proc.pid}) runs on this state_dir" in check.stdout
