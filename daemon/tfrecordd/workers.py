"""Encode worker processes (``encode_workers > 1``), each fed one batch ahead.

A worker that gets its next batch only after the daemon has read its last answer waits, between
every two batches, for the daemon's event loop to come round (to read the answer, hand out the
next batch, write it to the pipe): measured, about a third of a worker's time. Here each worker
holds up to :data:`DEPTH` requests: while it encodes one, the next already waits in its pipe, and
answers come back in the order the requests went. A request may hold several batches
(:meth:`EncodeWorkers.call_many`): each trip costs the daemon's process a pickle, a pipe write, an
answer and a wake-up, whatever its size, and that process is the pipeline's narrow part.

A worker is ``python -m tfrecordd.workers``, in a session of its own: a Ctrl-C in a terminal
reaches the daemon, which drains, and needs its workers for that (they ignore SIGINT and SIGTERM
sent to them directly too). It is told the encoders' configs once, at start-up, answers that it
is ready (so an import error shows at start, not at the first batch), builds each encoder on
first use, and exits when its input closes: when the daemon stops, or dies.

The protocol, on the worker's stdin and stdout: a request is a header (the pickle's length, the
number of out-of-band buffers and each one's length, little-endian), a pickle (protocol 5) of a
list of batches, then those buffers: the bytes of each batch's lines, which cross the pipe as they
are instead of being copied into the pickle and out of it. An answer is one status byte (``R`` a
list of results, one per batch, ``E`` an exception), a length, a pickle.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import signal
import struct
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import anyio
from anyio.abc import Process, TaskStatus

from tfrecordd.errors import WorkerError

if TYPE_CHECKING:
    from tfrecordd.plugin import Encoder, EncoderConfig

DEPTH = 2
"""Requests a worker holds at once: the one it encodes and the next."""

_LENGTH = struct.Struct("<Q")
_HEAD = struct.Struct("<QI")
_ANSWER = struct.Struct("<cQ")

_READY = b"ready\n"
_START_TIMEOUT = 60.0
"""Seconds a worker may take to import and start (a loaded machine, a cold disk)."""

_PIPE_BYTES = 1 << 20
"""Linux's default cap for an unprivileged process (``/proc/sys/fs/pipe-max-size``)."""

_IOV_MAX = 1024
"""The most buffers one ``writev`` takes (Linux's ``IOV_MAX``)."""


@dataclass(slots=True)
class _Pending:
    done: anyio.Event = field(default_factory=anyio.Event)
    ok: bool = False
    value: Any = None


@dataclass(slots=True)
class _Worker:
    process: Process
    requests: int
    """The write end of the worker's stdin (non-blocking)."""
    answers: int
    """The read end of the worker's stdout (non-blocking)."""
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    pending: deque[_Pending] = field(default_factory=deque)
    broken: BaseException | None = None


class EncodeWorkers:
    """``count`` worker processes; :meth:`call` encodes a batch in one of them. Run
    :meth:`run` in a task group (``await tg.start(pool.run)``); cancel it to stop them."""

    def __init__(self, count: int, encoders: dict[str, EncoderConfig]) -> None:
        self.count = count
        self._encoders = encoders
        self._workers: list[_Worker] = []
        self._room = anyio.Condition()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, then read their answers until cancelled; stop them on the way out."""
        try:
            # All spawned first: they import at the same time.
            for _ in range(self.count):
                worker = await self._spawn()
                self._workers.append(worker)
                # A worker that died at once breaks the pipe: _ready() says so, with its status.
                with contextlib.suppress(BrokenPipeError):
                    await _send_all(worker.requests, _message((sys.path, self._encoders)))
            for worker in self._workers:
                await self._ready(worker)
            async with anyio.create_task_group() as tg:
                for worker in self._workers:
                    tg.start_soon(self._read_answers, worker)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                for worker in self._workers:
                    await self._stop(worker)

    async def _spawn(self) -> _Worker:
        # The daemon's ends of the pipes are its own file descriptors, read and written as the
        # event loop finds them ready: an answer lands in one buffer of its size, where asyncio's
        # stream reader would copy it through its buffer several times and pause reading twice.
        request_r, request_w = os.pipe()
        answer_r, answer_w = os.pipe()
        try:
            process = await anyio.open_process(
                [sys.executable, "-m", "tfrecordd.workers"],
                stdin=request_r,
                stdout=answer_w,
                stderr=None,
                start_new_session=True,
            )
        except BaseException:
            os.close(request_w)
            os.close(answer_r)
            raise
        finally:
            os.close(request_r)
            os.close(answer_w)
        for fd in (request_w, answer_r):
            os.set_blocking(fd, False)
            _widen_pipe(fd)
        return _Worker(process, request_w, answer_r)

    async def _ready(self, worker: _Worker) -> None:
        process = worker.process
        try:
            with anyio.fail_after(_START_TIMEOUT):
                ready = await _receive_exactly(worker.answers, len(_READY))
        except (EOFError, TimeoutError) as e:
            process.kill()
            raise WorkerError(
                f"encode worker {process.pid} did not start (its error is in the log above)"
            ) from e
        if ready != _READY:
            raise WorkerError(f"encode worker {process.pid} answered {bytes(ready)!r} at start")

    async def _stop(self, worker: _Worker) -> None:
        process = worker.process
        with contextlib.suppress(OSError):
            os.close(worker.requests)  # the worker's end of input: it exits
        with anyio.move_on_after(5):
            await process.wait()
        if process.returncode is None:
            process.kill()
        await process.aclose()
        with contextlib.suppress(OSError):
            os.close(worker.answers)

    async def _read_answers(self, worker: _Worker) -> None:
        try:
            while True:
                try:
                    head = await _receive_exactly(worker.answers, _ANSWER.size)
                    status, length = _ANSWER.unpack(head)
                    body = await _receive_exactly(worker.answers, length)
                except (EOFError, OSError) as e:
                    raise await _gone(worker) from e
                if not worker.pending:
                    raise WorkerError("encode worker answered a batch it was not given")
                pending = worker.pending.popleft()
                pending.ok, pending.value = status == b"R", pickle.loads(body)
                pending.done.set()
                async with self._room:
                    self._room.notify()
        except BaseException as e:
            worker.broken = e
            for pending in worker.pending:
                pending.value = e
                pending.done.set()
            raise

    async def call(self, *args: Any) -> Any:
        """Encode a batch, ``args = (encoder name, shipment, lines, compression, level)`` (see
        ``tfrecordd.runtime._encode_events``), in the worker with the fewest requests, waiting
        while every worker holds :data:`DEPTH`."""
        (result,) = await self.call_many([args])
        return result

    async def call_many(self, requests: list[tuple[Any, ...]]) -> list[Any]:
        """Encode several batches (each as :meth:`call` takes it) in one trip to one worker: one
        pipe write, one answer and one wake-up of the daemon for all of them."""
        request = _message(requests)
        async with self._room:
            while True:
                worker = min(self._workers, key=lambda w: len(w.pending))
                if len(worker.pending) < DEPTH:
                    break
                await self._room.wait()
        if worker.broken is not None:
            raise WorkerError(f"encode worker {worker.process.pid}: {worker.broken}")
        pending = _Pending()
        # A request cut short by a cancel would leave the worker reading half a pickle: once
        # queued, it is written whole.
        with anyio.CancelScope(shield=True):
            worker.pending.append(pending)
            try:
                async with worker.lock:
                    await _send_all(worker.requests, request)
            except OSError as e:
                # The worker died before its reader saw it: the same error either way.
                raise await _gone(worker) from e
        await pending.done.wait()
        if not pending.ok:
            raise pending.value
        results: list[Any] = pending.value
        return results


async def _gone(worker: _Worker) -> WorkerError:
    """The error for a worker whose pipe broke, with how its process ended."""
    with anyio.move_on_after(1):
        await worker.process.wait()
    return WorkerError(
        f"encode worker {worker.process.pid} exited ({_status(worker.process.returncode)}); "
        "the events it held replay after a restart"
    )


def _status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _widen_pipe(fd: int) -> None:
    """Give a pipe room for a whole batch (Linux): with the default 64 KiB a batch crosses in
    pieces, and the reader wakes for each piece."""
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


async def _send_all(fd: int, parts: list[bytes]) -> None:
    """Write ``parts`` to the non-blocking ``fd``, in order and whole, with as few system calls
    as the pipe's room allows (no copy of them is made)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        try:
            sent = os.writev(fd, views[:_IOV_MAX])
        except BlockingIOError:
            await anyio.wait_writable(fd)
            continue
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


async def _receive_exactly(fd: int, n: int) -> bytearray:
    """Exactly ``n`` bytes from the non-blocking ``fd``, read into one buffer of that size;
    :class:`EOFError` if the input ends first."""
    data = bytearray(n)
    view = memoryview(data)
    got = 0
    while got < n:
        try:
            count = os.readv(fd, [view[got:]])
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not count:
            raise EOFError(f"the pipe closed after {got} of {n} bytes")
        got += count
    return data


def _message(obj: Any) -> list[bytes]:
    """``obj`` as a request's parts: header, pickle, then the buffers pickled out of band."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    parts = [_whole(b.raw()) for b in buffers]
    head = _HEAD.pack(len(body), len(parts)) + b"".join(_LENGTH.pack(len(p)) for p in parts)
    return [head, body, *parts]


def _whole(view: memoryview) -> bytes:
    """The bytes object a buffer views, when it views one whole (no copy), else a copy."""
    obj = view.obj
    return obj if isinstance(obj, bytes) and len(obj) == view.nbytes else view.tobytes()


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def _read(stream: BinaryIO) -> tuple[bytes, list[bytes]] | None:
    """A request's pickle and its out-of-band buffers; ``None`` at the end of the input."""
    head = _read_exactly(stream, _HEAD.size)
    if head is None:
        return None
    length, count = _HEAD.unpack(head)
    sizes = _read_exactly(stream, count * _LENGTH.size)
    body = _read_exactly(stream, length)
    if sizes is None or body is None:
        return None
    buffers = []
    for (size,) in _LENGTH.iter_unpack(sizes):
        buffer = _read_exactly(stream, size)
        if buffer is None:
            return None
        buffers.append(buffer)
    return body, buffers


def _pickled_error(e: Exception) -> bytes:
    try:
        return pickle.dumps(e, pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle still reaches the daemon, as text
        error = WorkerError(f"in an encode worker: {type(e).__name__}: {e}")
        return pickle.dumps(error, pickle.HIGHEST_PROTOCOL)


def serve() -> None:
    """The worker's main loop (``python -m tfrecordd.workers``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    # Whatever encoder code prints must not reach the protocol's stream.
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout = sys.stderr
    for fd in (0, 1):
        _widen_pipe(fd)
    init = _read(inp)
    if init is None:
        return
    sys.path[:], configs = pickle.loads(init[0], buffers=init[1])
    from tfrecordd.runtime import _encode_events, _unship

    encoders: dict[str, Encoder] = {}

    out.write(_READY)
    out.flush()

    while (request := _read(inp)) is not None:
        try:
            outcomes = []
            body, buffers = request
            for name, shipment, lines, compression, level in pickle.loads(body, buffers=buffers):
                encoder = encoders.get(name)
                if encoder is None:
                    encoder = encoders[name] = configs[name].build()
                events = _unship(shipment)
                outcomes.append(_encode_events(encoder, events, lines, compression, level))
            status, answer = b"R", pickle.dumps(outcomes, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # handed to the daemon, which raises it
            status, answer = b"E", _pickled_error(e)
        out.write(_ANSWER.pack(status, len(answer)))
        out.write(answer)
        out.flush()


if __name__ == "__main__":
    serve()
