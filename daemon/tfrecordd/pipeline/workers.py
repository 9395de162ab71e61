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

The protocol and the shared memory are :mod:`tfrecordd.pipeline.workerio`'s.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import signal
import sys
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Process, TaskStatus

from tfrecordd import heap
from tfrecordd.errors import WorkerError
from tfrecordd.pipeline.encoding import EncodeRequest, Outcome
from tfrecordd.pipeline.joining import encode_all
from tfrecordd.pipeline.routing import Target, TargetConfig
from tfrecordd.pipeline.workerio import (
    ANSWER,
    DEPTH,
    IN_PIPE,
    READY,
    SLOT_BYTES,
    frame,
    pickle_out_of_band,
    pickled_error,
    read_request,
    receive_exactly,
    send_all,
    shared_area,
    widen_pipe,
)

if TYPE_CHECKING:
    from tfrecordd.plugin import Encoder, EncoderConfig

log = logging.getLogger(__name__)

_START_TIMEOUT = 60.0
"""Seconds a worker may take to import and start (a loaded machine, a cold disk)."""


@dataclass(slots=True)
class _Pending:
    slot: int = IN_PIPE
    done: anyio.Event = field(default_factory=anyio.Event)
    ok: bool = False
    value: Any = None


@dataclass(slots=True)
class Worker:
    """One worker process, as the daemon holds it."""

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
    """The requests sent and not yet answered, oldest first (at most :data:`DEPTH`)."""
    reserved: int = 0
    """Places reserved for requests not yet sent (:meth:`EncodeWorkers.reserve`)."""
    broken: BaseException | None = None


class EncodeWorkers:
    """``count`` worker processes, and ``local`` (if given) run in a thread of this process;
    :meth:`call` encodes a request in one of them. ``local`` takes a list of requests as
    :meth:`call_many` does and returns their results; it runs one list at a time. Run :meth:`run`
    in a task group (``await tg.start(pool.run)``); cancel it to stop the processes."""

    def __init__(
        self,
        count: int,
        encoders: Mapping[str, EncoderConfig | TargetConfig],
        *,
        local: Callable[[list[EncodeRequest]], list[Outcome]] | None = None,
    ) -> None:
        if count < 1 and local is None:
            raise ValueError("encode workers: no worker process and no local encoder")
        self.count = count
        self._encoders = encoders
        self._workers: list[Worker] = []
        self._room = anyio.Condition()
        self._local = local
        self._local_busy = False

    @property
    def workers(self) -> tuple[Worker, ...]:
        """The worker processes started so far, in the order they were started."""
        return tuple(self._workers)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, then read their answers until cancelled; stop them on the way out."""
        try:
            # All spawned first: they import at the same time.
            for _ in range(self.count):
                worker = await self._spawn()
                self._workers.append(worker)
                # A worker that died at once breaks the pipe: _ready() says so, with its status.
                init = frame(*pickle_out_of_band((sys.path, self._encoders)), IN_PIPE)
                with contextlib.suppress(BrokenPipeError):
                    await send_all(worker.requests, init)
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

    async def _spawn(self) -> Worker:
        # The daemon's ends of the pipes are its own file descriptors, read and written as the
        # event loop finds them ready: an answer lands in one buffer of its size, where asyncio's
        # stream reader would copy it through its buffer several times and pause reading twice.
        request_r, request_w = os.pipe()
        answer_r, answer_w = os.pipe()
        area_fd, area = shared_area()  # (None, None) if it fails: requests use the pipe
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
            widen_pipe(fd)
        return Worker(process, request_w, answer_r, area)

    async def _ready(self, worker: Worker) -> None:
        process = worker.process
        try:
            with anyio.fail_after(_START_TIMEOUT):
                ready = await receive_exactly(worker.answers, len(READY))
        except (EOFError, TimeoutError) as e:
            process.kill()
            raise WorkerError(
                f"encode worker {process.pid} did not start (its error is in the log above)"
            ) from e
        if ready != READY:
            raise WorkerError(f"encode worker {process.pid} answered {bytes(ready)!r} at start")

    async def _stop(self, worker: Worker) -> None:
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

    async def _read_answers(self, worker: Worker) -> None:
        try:
            while True:
                try:
                    head = await receive_exactly(worker.answers, ANSWER.size)
                    status, length = ANSWER.unpack(head)
                    body = await receive_exactly(worker.answers, length)
                except (EOFError, OSError) as e:
                    raise await _gone(worker) from e
                if not worker.pending:
                    raise WorkerError("encode worker answered a batch it was not given")
                pending = worker.pending.popleft()
                if pending.slot != IN_PIPE:
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
        return await self.call_on(await self.reserve(), requests)

    async def reserve(self) -> Worker | None:
        """A place for the next requests, waiting for one: the local thread (``None``) if it is
        free, else the worker with the fewest requests, while every worker holds
        :data:`DEPTH`. Hand it to :meth:`call_on`, which frees it. The encode stage reserves
        before it takes the batches waiting: those that come meanwhile join the group."""
        async with self._room:
            while True:
                if self._local is not None and not self._local_busy:
                    self._local_busy = True
                    return None
                worker = min(self._workers, key=lambda w: len(w.pending) + w.reserved, default=None)
                if worker is not None and len(worker.pending) + worker.reserved < DEPTH:
                    worker.reserved += 1
                    return worker
                await self._room.wait()

    async def call_on(self, worker: Worker | None, requests: list[EncodeRequest]) -> list[Outcome]:
        """Encode ``requests`` in the place :meth:`reserve` gave (freed, whatever happens)."""
        if worker is None:
            return await self._call_local(requests)
        return await self._call_worker(worker, requests)

    async def release(self, worker: Worker | None) -> None:
        """Free a place :meth:`reserve` gave that no request takes."""
        if worker is None:
            self._local_busy = False
        else:
            worker.reserved -= 1
        async with self._room:
            self._room.notify()

    async def _call_worker(self, worker: Worker, requests: list[EncodeRequest]) -> list[Outcome]:
        try:
            body, buffers = pickle_out_of_band(requests)
            size = sum(map(len, buffers))
            if worker.broken is not None:
                raise WorkerError(f"encode worker {worker.process.pid}: {worker.broken}")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.release(worker)
            raise
        pending = _Pending()
        if worker.area is not None and worker.free and size <= SLOT_BYTES:
            pending.slot = worker.free.pop()
            at = pending.slot * SLOT_BYTES
            for buffer in buffers:
                worker.area[at : at + len(buffer)] = buffer
                at += len(buffer)
        request = frame(body, buffers, pending.slot)
        # A request cut short by a cancel would leave the worker reading half a pickle: once
        # queued, it is written whole.
        with anyio.CancelScope(shield=True):
            worker.reserved -= 1
            worker.pending.append(pending)
            try:
                async with worker.lock:
                    await send_all(worker.requests, request)
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


async def _gone(worker: Worker) -> WorkerError:
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
        widen_pipe(fd)
    area = None
    if len(sys.argv) > 1:
        with contextlib.closing(os.fdopen(int(sys.argv[1]), "rb")) as shared:
            area = mmap.mmap(shared.fileno(), 0, prot=mmap.PROT_READ)
    init = read_request(inp)
    if init is None:
        return
    sys.path[:], configs = pickle.loads(init[0], buffers=init[1])
    encoders: dict[str, Encoder | Target] = {}

    def built_of(name: str) -> Encoder | Target:
        built = encoders.get(name)
        if built is None:
            built = encoders[name] = configs[name].build()
        return built

    out.write(READY)
    out.flush()

    while (request := read_request(inp, area)) is not None:
        try:
            body, buffers = request
            requests: list[EncodeRequest] = pickle.loads(body, buffers=buffers)
            outcomes = encode_all(built_of, requests)
            status, answer = b"R", pickle.dumps(outcomes, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # handed to the daemon, which raises it
            status, answer = b"E", pickled_error(e)
        out.write(ANSWER.pack(status, len(answer)))
        out.write(answer)
        out.flush()


if __name__ == "__main__":
    serve()
