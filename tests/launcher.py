"""Daemon processes for the tests, forked from a warm interpreter instead of started cold.

The suite starts a few hundred daemons; a cold ``python -m tfrecordd run`` spends most of a
second of CPU importing pydantic, protobuf, the Redis client and the package before it reads a
byte. A :class:`Launcher` keeps one interpreter per test process (a *template*) that has
imported all of that once, with no thread running, and forks each daemon from it: the child
sets up what a fresh start would have (its own session if asked, stdout and stderr on the log,
the working directory, the environment, the crash point armed from it, ``sys.argv``) and runs
the same ``tfrecordd.cli.main`` as ``python -m tfrecordd``, exiting through the interpreter's
normal shutdown. It is still a process of its own: signals, SIGKILL, its exit status and its
children are real.

What a fork cannot give falls back to a cold start (:func:`forkable`): an environment that
differs from the template's in a variable read at import time (``TFRECORDD_*`` but the crash
point, ``PYTHON*``, the allocator's), and callers that time kills against start-up itself (the
crash harness's random kills start cold, so they land in imports too).
``TFRECORDD_TEST_FORK=0`` turns the launcher off.

The template is a child of the test process, the daemons are the template's children, so the
template reaps them and writes each exit status to a file the test polls
(:class:`LaunchedProcess` has the part of :class:`subprocess.Popen` the tests use).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WARM = (
    "tfrecordd.cli",
    "tfrecordd.cli.service",
    "tfrecordd.config",
    "tfrecordd.pipeline.runtime",
    "tfrecordd.outputs",
)
"""Modules the template imports; with them, every plugin the registry knows."""

IMPORT_TIME_PREFIXES = ("TFRECORDD_", "PYTHON", "MALLOC_", "GLIBC_TUNABLES", "LD_")
"""Environment variables read while modules are imported: a daemon whose value differs from
the template's is started cold."""
RUNTIME_ONLY = frozenset({"TFRECORDD_CRASH_AT", "PYTHONUNBUFFERED"})
"""Of those, the ones the child sets up itself (the crash point is armed again; stdout and
stderr are the log file, unbuffered as the template's are)."""


def forkable(env: Mapping[str, str], template_env: Mapping[str, str]) -> bool:
    """Whether a daemon with ``env`` may be forked from a template started with
    ``template_env``."""
    keys = {k for k in (*env, *template_env) if k.startswith(IMPORT_TIME_PREFIXES)}
    return all(env.get(k) == template_env.get(k) for k in keys - RUNTIME_ONLY)


class LaunchedProcess:
    """A daemon forked by the template: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``
    and ``returncode`` as :class:`subprocess.Popen` has them (a signal's death is ``-signum``)."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid = pid
        self._status = status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"tfrecordd pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The template interpreter of this test process, started on first use."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}
        self._count = 0
        self._statuses: Path | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._env = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
            self._env.pop("TFRECORDD_CRASH_AT", None)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "import tests.launcher as l; raise SystemExit(l.serve())"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._env,
                cwd=Path(__file__).resolve().parent.parent,
            )
        return self._proc

    def forkable(self, env: Mapping[str, str]) -> bool:
        if os.environ.get("TFRECORDD_TEST_FORK", "1") == "0":
            return False
        self._start()
        return forkable(env, self._env)

    def launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        *,
        own_group: bool = False,
        stderr: Path | None = None,
        cwd: Path | None = None,
    ) -> LaunchedProcess:
        """Fork ``tfrecordd ARGV...`` from the template, appending its output to ``log`` (its
        standard error to ``stderr``, if given), in ``cwd`` (default: this process's)."""
        proc = self._start()
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._count += 1
        if self._statuses is None:
            self._statuses = Path(tempfile.mkdtemp(prefix="tfrecordd-launcher-"))
        status = self._statuses / str(self._count)
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "log": str(log),
            "stderr": str(stderr or log),
            "status": str(status),
            "own_group": own_group,
        }
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the daemon template exited ({proc.wait()})")
        return LaunchedProcess(int(line), status)

    def close(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
        if self._statuses is not None:
            shutil.rmtree(self._statuses, ignore_errors=True)


LAUNCHER = Launcher()
"""This test process's launcher."""


# -- the template ---------------------------------------------------------------------------


def _warm_up() -> None:
    import importlib

    from tfrecordd.plugin import Registry

    for name in WARM:
        importlib.import_module(name)
    registry = Registry.from_entry_points()
    dict(registry.sources), dict(registry.encoders)


def _child(request: dict[str, Any]) -> int:
    """In the forked child: become the daemon the request describes, and run it."""
    if request["own_group"]:
        os.setsid()
    for target, path in ((1, request["log"]), (2, request["stderr"])):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from tfrecordd import crashpoints
    from tfrecordd.cli import main

    crashpoints.arm(os.environ.get("TFRECORDD_CRASH_AT"))
    sys.argv = ["tfrecordd", *request["argv"]]
    return main(request["argv"])


def _reap(statuses: dict[int, str]) -> None:
    while statuses:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = statuses.pop(pid, None)
        if path is not None:
            tmp = f"{path}.tmp"
            Path(tmp).write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(tmp, path)


def serve() -> int:
    """The template's loop: fork a daemon per request line on stdin, answer its pid on stdout,
    write each one's exit status when it is reaped; return at EOF. In a child, return the
    daemon's exit status (the caller exits with it, through the interpreter's shutdown)."""
    _warm_up()
    # A fork copies only the forking thread: with another one running, a lock it held would
    # stay held in every daemon.
    assert threading.active_count() == 1, threading.enumerate()
    statuses: dict[int, str] = {}
    pending = b""
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    while True:
        ready = selector.select(timeout=0.02)
        _reap(statuses)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return 0
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                selector.close()
                return _child(request)
            statuses[pid] = request["status"]
            os.write(1, f"{pid}\n".encode())


atexit.register(LAUNCHER.close)
