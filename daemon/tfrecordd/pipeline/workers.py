"""Encoders beside the daemon's event loop (``encode_workers > 1``): worker processes, each fed
one batch ahead, and the daemon's own encode thread.

With ``encode_workers = N`` the daemon encodes in its own thread and in N - 1 worker processes:
N encoders for N cores. A request goes to the daemon's thread when it is free (no pickle, no
pipe), else to the worker with room. Measured on 2 cores, against two worker processes: 4-5% less
CPU per event and 1.83-1.85x one encoder instead of 1.70-1.72x, because a third process no longer
takes turns with the workers on two cores, and the requests the thread takes cross no pipe. The
thread shares the interpreter lock with the event loop, so it takes what the loop leaves: the
workers are fed :data:`DEPTH` requests ahead and keep encoding while the loop waits for the lock.

A worker that gets its next batch only after the daemon has read its last answer waits, between
every two batches, for the daemon's event loop to come round (to read the answer, hand out the
next batch, write it to the pipe): measured, about a third of a worker's time. Here each worker
holds up to :data:`DEPTH` requests: while it encodes one, the next already waits in its pipe, and
answers come back in the order the requests went. A request may hold several batches
(:meth:`EncodeWorkers.call_many`): each trip costs the daemon's process a pickle, a pipe write, an
answer and a wake-up, whatever its size, and that process is the pipeline's narrow part.

A worker is ``python -m tfrecordd.pipeline.workers``, in a session of its own: a Ctrl-C in a
terminal reaches the daemon, which drains, and needs its workers for that (they ignore SIGINT and
SIGTERM sent to them directly too). It is told the encoders' configs once, at start-up, answers
that it is ready (so an import error shows at start, not at the first batch), builds each encoder
on first use, and exits when its input closes: when the daemon stops, or dies.

The protocol, on the worker's stdin and stdout: a request is a header (the pickle's length, the
number of out-of-band buffers, the shared slot they are in or -1, then each one's length,
little-endian), a pickle (protocol 5) of a list of ``EncodeRequest``, then, unless they are in a
slot, those buffers: the bytes of each request's lines, kept out of the pickle. An answer is one
status byte (``R`` a list of ``Outcome``, one per request, ``E`` an exception), a length, a pickle.

The lines are most of what crosses, and a pipe costs a copy into the kernel and one out of it,
both on the CPU the workers need: measured, a few percent of the whole pipeline's CPU. So each
worker shares an area of memory with the daemon (a ``memfd``, where the system has it), in
:data:`DEPTH` slots of :data:`SLOT_BYTES`: a request's lines are copied into a free slot (one
copy in user space) and the worker reads them there; the slot is free again once the worker has
answered. A request too large for a slot crosses the pipe as it always could.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import pickle
import signal
import struct
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import anyio
from anyio.abc import Process, TaskStatus

from tfrecordd import heap
from tfrecordd.errors import WorkerError
from tfrecordd.pipeline.encoding import EncodeRequest, Outcome, encode

if TYPE_CHECKING:
    from tfrecordd.plugin import Encoder, EncoderConfig

log = logging.getLogger(__name__)

DEPTH = 2
"""Requests a worker holds at once: the one it encodes and the next."""

_LENGTH = struct.Struct("<Q")
_HEAD = struct.Struct("<QIi")
_ANSWER = struct.Struct("<cQ")

_READY = b"ready\n"
_START_TIMEOUT = 60.0
"""Seconds a worker may take to import and start (a loaded machine, a cold disk)."""

_PIPE_BYTES = 1 << 20
"""Linux's default cap for an unprivileged process (``/proc/sys/fs/pipe-max-size``)."""

_IOV_MAX = 1024
"""The most buffers one ``writev`` takes (Linux's ``IOV_MAX``)."""

SLOT_BYTES = 8 << 20
"""Room for one request's lines in a worker's shared area: ``GROUP_BATCHES`` batches of the
default ``max_batch_bytes`` (1 MiB), twice over. Memory is used only as far as requests reach."""

_IN_PIPE = -1
"""The slot of a request whose buffers follow it in the pipe."""

_MFD_NOEXEC_SEAL = 8
"""``MFD_NOEXEC_SEAL`` (Linux 6.3), which Python 3.11's ``os`` does not name."""


@dataclass(slots=True)
class _Pending:
    slot: int = _IN_PIPE
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
    area: mmap.mmap | None
    """Memory shared with the worker: :data:`DEPTH` slots of :data:`SLOT_BYTES`."""
    free: list[int] = field(default_factory=lambda: list(range(DEPTH)))
    """The slots of :attr:`area` no request holds."""
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    pending: deque[_Pending] = field(default_factory=deque)
    broken: BaseException | None = None


class EncodeWorkers:
    """``count`` worker processes, and ``local`` (if given) run in a thread of this process;
    :meth:`call` encodes a request in one of them. ``local`` takes a list of requests as
    :meth:`call_many` does and returns their results; it runs one list at a time. Run :meth:`run`
    in a task group (``await tg.start(pool.run)``); cancel it to stop the processes."""

    def __init__(
        self,
        count: int,
        encoders: dict[str, EncoderConfig],
        *,
        local: Callable[[list[EncodeRequest]], list[Outcome]] | None = None,
    ) -> None:
        if count < 1 and local is None:
            raise ValueError("encode workers: no worker process and no local encoder")
        self.count = count
        self._encoders = encoders
        self._workers: list[_Worker] = []
        self._room = anyio.Condition()
        self._local = local
        self._local_busy = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, then read their answers until cancelled; stop them on the way out."""
        try:
            # All spawned first: they import at the same time.
            for _ in range(self.count):
                worker = await self._spawn()
                self._workers.append(worker)
                # A worker that died at once breaks the pipe: _ready() says so, with its status.
                init = _frame(*_pickle((sys.path, self._encoders)), _IN_PIPE)
                with contextlib.suppress(BrokenPipeError):
                    await _send_all(worker.requests, init)
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
        area_fd, area = _shared_area()  # (None, None) if it fails: requests use the pipe
        command = [sys.executable, "-m", "tfrecordd.pipeline.workers"]
        try:
            process = await anyio.open_process(
                command if area_fd is None else [*command, str(area_fd)],
                stdin=request_r,
                stdout=answer_w,
                stderr=None,
                start_new_session=True,
                pass_fds=() if area_fd is None else (area_fd,),
            )
        except BaseException:
            os.close(request_w)
            os.close(answer_r)
            if area is not None:
                area.close()
            raise
        finally:
            os.close(request_r)
            os.close(answer_w)
            if area_fd is not None:
                os.close(area_fd)
        for fd in (request_w, answer_r):
            os.set_blocking(fd, False)
            _widen_pipe(fd)
        return _Worker(process, request_w, answer_r, area)

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
        if worker.area is not None:
            worker.area.close()

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
                if pending.slot != _IN_PIPE:
                    worker.free.append(pending.slot)
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

    async def call(self, request: EncodeRequest) -> Outcome:
        """Encode a request (:func:`~tfrecordd.pipeline.encoding.encode`): in the local thread
        if it is free, else in the worker with the fewest requests, waiting while every worker
        holds :data:`DEPTH`."""
        (result,) = await self.call_many([request])
        return result

    async def call_many(self, requests: list[EncodeRequest]) -> list[Outcome]:
        """Encode several requests together: in the local thread if it is free, else in one
        trip to one worker (one pipe write, one answer and one wake-up of the daemon for all of
        them)."""
        async with self._room:
            while True:
                if self._local is not None and not self._local_busy:
                    self._local_busy = True
                    worker = None
                    break
                worker = min(self._workers, key=lambda w: len(w.pending), default=None)
                if worker is not None and len(worker.pending) < DEPTH:
                    break
                await self._room.wait()
        if worker is None:
            return await self._call_local(requests)
        body, buffers = _pickle(requests)
        size = sum(map(len, buffers))
        if worker.broken is not None:
            raise WorkerError(f"encode worker {worker.process.pid}: {worker.broken}")
        pending = _Pending()
        if worker.area is not None and worker.free and size <= SLOT_BYTES:
            pending.slot = worker.free.pop()
            at = pending.slot * SLOT_BYTES
            for buffer in buffers:
                worker.area[at : at + len(buffer)] = buffer
                at += len(buffer)
        request = _frame(body, buffers, pending.slot)
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
        results: list[Outcome] = pending.value
        return results

    async def _call_local(self, requests: list[EncodeRequest]) -> list[Outcome]:
        assert self._local is not None
        try:
            return await anyio.to_thread.run_sync(self._local, requests)
        finally:
            self._local_busy = False
            async with self._room:
                self._room.notify()


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


def _shared_area() -> tuple[int | None, mmap.mmap | None]:
    """A new area to share with a worker, and its file descriptor (for ``pass_fds``), or
    ``(None, None)`` where there is none to be had: requests then cross the pipe whole."""
    if not hasattr(os, "memfd_create"):
        return None, None
    fd = None
    try:
        try:
            # Sealed against execution where the kernel knows how (6.3 and later; a kernel set
            # to refuse executable memfds refuses unsealed ones), else as older kernels make them.
            fd = os.memfd_create("tfrecordd-requests", os.MFD_CLOEXEC | _MFD_NOEXEC_SEAL)
        except OSError:
            fd = os.memfd_create("tfrecordd-requests", os.MFD_CLOEXEC)
        os.ftruncate(fd, DEPTH * SLOT_BYTES)
        return fd, mmap.mmap(fd, DEPTH * SLOT_BYTES)
    except OSError as e:
        if fd is not None:
            os.close(fd)
        log.warning("encode workers: no shared memory (%s); requests go through pipes", e)
        return None, None


def _pickle(obj: Any) -> tuple[bytes, list[bytes]]:
    """``obj``'s pickle, and the buffers pickled out of band (the very bytes objects ``obj``
    holds, not copies, where it holds whole ones)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    return body, [_whole(b.raw()) for b in buffers]


def _frame(body: bytes, buffers: list[bytes], slot: int) -> list[bytes]:
    """A request's parts: header, pickle, then the buffers, unless they are in shared ``slot``."""
    sizes = b"".join(_LENGTH.pack(len(b)) for b in buffers)
    head = _HEAD.pack(len(body), len(buffers), slot) + sizes
    return [head, body, *buffers] if slot == _IN_PIPE else [head, body]


def _whole(view: memoryview) -> bytes:
    """The bytes object a buffer views, when it views one whole (no copy), else a copy."""
    obj = view.obj
    return obj if isinstance(obj, bytes) and len(obj) == view.nbytes else view.tobytes()


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def _read(stream: BinaryIO, area: mmap.mmap | None = None) -> tuple[bytes, list[bytes]] | None:
    """A request's pickle and its out-of-band buffers (from the pipe, or copied out of their
    slot of ``area``); ``None`` at the end of the input."""
    head = _read_exactly(stream, _HEAD.size)
    if head is None:
        return None
    length, count, slot = _HEAD.unpack(head)
    sizes = _read_exactly(stream, count * _LENGTH.size)
    body = _read_exactly(stream, length)
    if sizes is None or body is None:
        return None
    buffers = []
    at = slot * SLOT_BYTES
    for (size,) in _LENGTH.iter_unpack(sizes):
        if slot == _IN_PIPE:
            buffer = _read_exactly(stream, size)
            if buffer is None:
                return None
        elif area is None:
            raise WorkerError("a request in shared memory, but this worker has none")
        else:
            buffer = area[at : at + size]
            at += size
        buffers.append(buffer)
    return body, buffers


def _pickled_error(e: Exception) -> bytes:
    try:
        return pickle.dumps(e, pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle still reaches the daemon, as text
        error = WorkerError(f"in an encode worker: {type(e).__name__}: {e}")
        return pickle.dumps(error, pickle.HIGHEST_PROTOCOL)


def serve() -> None:
    """The worker's main loop (``python -m tfrecordd.pipeline.workers``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    heap.tune()
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    # Whatever encoder code prints must not reach the protocol's stream.
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout = sys.stderr
    for fd in (0, 1):
        _widen_pipe(fd)
    area = None
    if len(sys.argv) > 1:
        with contextlib.closing(os.fdopen(int(sys.argv[1]), "rb")) as shared:
            area = mmap.mmap(shared.fileno(), 0, prot=mmap.PROT_READ)
    init = _read(inp)
    if init is None:
        return
    sys.path[:], configs = pickle.loads(init[0], buffers=init[1])
    encoders: dict[str, Encoder] = {}

    out.write(_READY)
    out.flush()

    while (request := _read(inp, area)) is not None:
        try:
            outcomes = []
            body, buffers = request
            requests: list[EncodeRequest] = pickle.loads(body, buffers=buffers)
            for one in requests:
                encoder = encoders.get(one.encoder)
                if encoder is None:
                    encoder = encoders[one.encoder] = configs[one.encoder].build()
                outcomes.append(encode(one, encoder))
            status, answer = b"R", pickle.dumps(outcomes, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # handed to the daemon, which raises it
            status, answer = b"E", _pickled_error(e)
        out.write(_ANSWER.pack(status, len(answer)))
        out.write(answer)
        out.flush()


if __name__ == "__main__":
    serve()
