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
(:class:`LaunchedProcess` has the part of :class:`subprocess.Popen` the tests use). It answers
a request only once the child has taken its session, output, directory and environment (a
failure there is raised in the test, as ``Popen`` raises it). Should the template die, a
daemon's status is lost: polling it then raises, quoting what the template wrote.

Before it forks, the template moves everything it imported out of the garbage collector's
reach (``gc.freeze()``, as the :mod:`gc` documentation advises for a pre-fork server): a child's
collections, its final one at exit included, would otherwise walk the whole inherited heap and
copy every page they touch. That was over half of a forked daemon's CPU (0.28 s for a start
and a stop, 0.12 s frozen). A cold start keeps those objects alive for as long, as modules.

One difference stays: forked daemons share the template's string-hash seed, so a set's order
is the same in each of them, where cold starts draw a seed each.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
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
import traceback
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
IMPORT_TIME_NAMES = frozenset(
    {
        "HOME",
        "TZ",
        "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
        "PROMETHEUS_MULTIPROC_DIR",
        "OPENSSL_CONF",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)
"""More of them: the user's site-packages (and with it the plugins found), the time zone, the
protobuf and Prometheus clients' modes, TLS set-up."""
RUNTIME_ONLY = frozenset({"TFRECORDD_CRASH_AT", "PYTHONUNBUFFERED"})
"""Of those, the ones the child sets up itself (the crash point is armed again; stdout and
stderr are the log file, unbuffered as the template's are)."""

REPLY_TIMEOUT = 60.0
"""How long a launch waits for the template's answer (its warm-up included)."""


def forkable(env: Mapping[str, str], template_env: Mapping[str, str]) -> bool:
    """Whether a daemon with ``env`` may be forked from a template started with
    ``template_env``."""
    keys = {
        k
        for k in (*env, *template_env)
        if k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES
    }
    return all(env.get(k) == template_env.get(k) for k in keys - RUNTIME_ONLY)


def enabled() -> bool:
    """Whether the suite forks its daemons (``TFRECORDD_TEST_FORK=0`` says no)."""
    return os.environ.get("TFRECORDD_TEST_FORK", "1") != "0"


class TemplateLost(RuntimeError):
    """The template died: the exit statuses of the daemons it forked are lost."""


class LaunchedProcess:
    """A daemon forked by the template: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``
    and ``returncode`` as :class:`subprocess.Popen` has them (a signal's death is ``-signum``)."""

    def __init__(self, pid: int, status: Path, template: Template) -> None:
        self.pid = pid
        self._status = status
        self._template = template
        self.returncode: int | None = None

    def _read_status(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            self.returncode = int(self._status.read_text())
        return self.returncode

    def poll(self) -> int | None:
        """The exit status, or ``None`` while it runs; raises :class:`TemplateLost` if the
        template died before reaping it."""
        if (
            self.returncode is None
            and self._read_status() is None
            and not self._template.alive()
            and self._read_status() is None
        ):
            raise TemplateLost(
                f"the template that forked pid {self.pid} died; its exit status is lost. "
                f"The template said: {self._template.said()[-2000:]!r}"
            )
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


class Template:
    """One running template interpreter: its process, its folder (exit statuses and what it
    wrote to standard error) and the requests it answered."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tfrecordd-launcher-"))
        self.env = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
        self.env.pop("TFRECORDD_CRASH_AT", None)
        self._err = self.folder / "template.err"
        with self._err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import tests.launcher as l; raise SystemExit(l.serve())"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env | {PARENT_ENV: str(os.getpid())},
                cwd=Path(__file__).resolve().parent.parent,
            )
        self._replies = b""
        self._count = 0

    @property
    def pid(self) -> int:
        """The template's process id."""
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def said(self) -> str:
        """What the template wrote to its standard error."""
        try:
            return self._err.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def request(self, request: dict[str, Any]) -> LaunchedProcess:
        """Send ``request`` and wait for its answer: the child's pid once it is set up."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self._count += 1
        request |= {"id": self._count, "status": str(self.folder / str(self._count))}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + REPLY_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
            while True:
                while b"\n" in self._replies:
                    line, _, self._replies = self._replies.partition(b"\n")
                    reply = json.loads(line)
                    if reply["id"] != self._count:
                        continue  # the answer to a launch that was cut short
                    if reply.get("error"):
                        raise OSError(reply.get("errno") or 0, reply["error"])
                    return LaunchedProcess(reply["pid"], Path(request["status"]), self)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer from the daemon template in {REPLY_TIMEOUT}s")
                if selector.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                    if not chunk:
                        raise TemplateLost(f"the daemon template exited: {self.said()[-2000:]}")
                    self._replies += chunk

    def close(self, *, kill: bool = False) -> None:
        """Let the template end (its stdin closed), or kill it."""
        if kill:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


class Launcher:
    """The template interpreter of this test process, started on first use (and again if it
    died)."""

    def __init__(self) -> None:
        self._template: Template | None = None

    def template(self) -> Template:
        """The running template, started if there is none."""
        if self._template is None or not self._template.alive():
            if self._template is not None:
                self._template.close()
            self._template = Template()
        return self._template

    def forkable(self, env: Mapping[str, str]) -> bool:
        """Whether a daemon with the whole environment ``env`` is forked from the template: in
        a running test (not in a script such as the crash harness's), with the launcher on, and
        an environment that imports what the template's did."""
        return (
            "PYTEST_CURRENT_TEST" in os.environ and enabled() and forkable(env, self.template().env)
        )

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
        umask = os.umask(0o022)
        os.umask(umask)
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "log": str(Path(log).absolute()),
            "stderr": str(Path(stderr or log).absolute()),
            "own_group": own_group,
            "umask": umask,
        }
        template = self.template()
        try:
            return template.request(request)
        except (TimeoutError, TemplateLost, KeyboardInterrupt):
            # A template that did not answer in time is not trusted with the next request.
            template.close(kill=True)
            raise

    def close(self) -> None:
        if self._template is not None:
            self._template.close()


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


def _set_up(request: dict[str, Any]) -> None:
    """In the forked child: take what a fresh start of this request would have."""
    if request["own_group"]:
        os.setsid()
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    for target, path in ((1, request["log"]), (2, request["stderr"])):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(request["env"])


def _run(request: dict[str, Any]) -> int:
    """In the set-up child: run the command, as ``python -m tfrecordd`` would."""
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


def _fork(request: dict[str, Any], statuses: dict[int, str]) -> tuple[int, dict[str, Any]]:
    """Fork the child of ``request``; in the template, its pid (0 in the child) and the
    answer to send once the child is set up (or failed to be)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            _set_up(request)
        except BaseException as e:
            errno = e.errno if isinstance(e, OSError) else None
            os.write(ready_w, json.dumps([errno, traceback.format_exc()]).encode())
            os._exit(70)
        os.close(ready_w)
        return 0, {}
    os.close(ready_w)
    failure = b""
    while chunk := os.read(ready_r, 1 << 16):
        failure += chunk
    os.close(ready_r)
    statuses[pid] = request["status"]
    if failure:
        errno, text = json.loads(failure)
        return pid, {"id": request["id"], "error": text, "errno": errno}
    return pid, {"id": request["id"], "pid": pid}


PARENT_ENV = "TFRECORDD_LAUNCHER_PARENT"
"""The environment variable that gives the template the pid of the test run that started it."""


def serve() -> int:
    """The template's loop: fork a daemon per request line on stdin, answer once it is set up,
    write each one's exit status when it is reaped; return at EOF. In a child, return the
    daemon's exit status (the caller exits with it, through the interpreter's shutdown)."""
    _warm_up()
    # A fork copies only the forking thread: with another one running, a lock it held would
    # stay held in every daemon.
    assert threading.active_count() == 1, threading.enumerate()
    gc.collect()
    gc.freeze()
    statuses: dict[int, str] = {}
    pending = b""
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    # The test run's pid as it gave it: the template may start after the run died.
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))
    while True:
        ready = selector.select(timeout=0.02)
        _reap(statuses)
        if os.getppid() != parent:
            # The test run is gone (killed, timed out) while its pipe to us lives on in a
            # process it started: a template left behind would poll for ever.
            return 0
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return 0
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            request = json.loads(line)
            pid, answer = _fork(request, statuses)
            if pid == 0:
                selector.close()
                return _run(request)
            os.write(1, json.dumps(answer).encode() + b"\n")


atexit.register(LAUNCHER.close)
