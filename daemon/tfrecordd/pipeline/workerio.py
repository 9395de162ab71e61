"""The encode workers' wire protocol, on each worker's stdin and stdout, and the memory a worker
shares with the daemon.

A request is a header (the pickle's length, the number of out-of-band buffers, the shared slot
they are in or :data:`IN_PIPE`, then each one's length, little-endian), a pickle (protocol 5) of a
list of ``EncodeRequest``, then, unless they are in a slot, those buffers: the bytes of each
request's lines, kept out of the pickle. An answer is one status byte (``R`` a list of
``Outcome``, one per request, ``E`` an exception), a length (:data:`ANSWER`), a pickle.

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
import struct
from typing import Any, BinaryIO

import anyio

from tfrecordd.errors import WorkerError

log = logging.getLogger(__name__)

DEPTH = 2
"""Requests a worker holds at once: the one it encodes and the next."""

LENGTH = struct.Struct("<Q")
"""One out-of-band buffer's length, after a request's :data:`HEAD`."""
HEAD = struct.Struct("<QIi")
"""A request's header: the pickle's length, the number of buffers, their slot."""
ANSWER = struct.Struct("<cQ")
"""An answer's header: its status byte and the pickle's length."""

READY = b"ready\n"
"""What a worker writes once it has started and read the encoders' configs."""

_PIPE_BYTES = 1 << 20
"""Linux's default cap for an unprivileged process (``/proc/sys/fs/pipe-max-size``)."""

_IOV_MAX = 1024
"""The most buffers one ``writev`` takes (Linux's ``IOV_MAX``)."""

SLOT_BYTES = 8 << 20
"""Room for one request's lines in a worker's shared area: ``GROUP_BATCHES`` batches of the
default ``max_batch_bytes`` (1 MiB), twice over. Memory is used only as far as requests reach."""

IN_PIPE = -1
"""The slot of a request whose buffers follow it in the pipe."""

_MFD_NOEXEC_SEAL = 8
"""``MFD_NOEXEC_SEAL`` (Linux 6.3), which Python 3.11's ``os`` does not name."""


def widen_pipe(fd: int) -> None:
    """Give a pipe room for a whole batch (Linux): with the default 64 KiB a batch crosses in
    pieces, and the reader wakes for each piece."""
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


async def send_all(fd: int, parts: list[bytes]) -> None:
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


async def receive_exactly(fd: int, n: int) -> bytearray:
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


def shared_area() -> tuple[int | None, mmap.mmap | None]:
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


def pickle_out_of_band(obj: Any) -> tuple[bytes, list[bytes]]:
    """``obj``'s pickle, and the buffers pickled out of band (the very bytes objects ``obj``
    holds, not copies, where it holds whole ones)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    return body, [_whole(b.raw()) for b in buffers]


def frame(body: bytes, buffers: list[bytes], slot: int) -> list[bytes]:
    """A request's parts: header, pickle, then the buffers, unless they are in shared ``slot``."""
    sizes = b"".join(LENGTH.pack(len(b)) for b in buffers)
    head = HEAD.pack(len(body), len(buffers), slot) + sizes
    return [head, body, *buffers] if slot == IN_PIPE else [head, body]


def _whole(view: memoryview) -> bytes:
    """The bytes object a buffer views, when it views one whole (no copy), else a copy."""
    obj = view.obj
    return obj if isinstance(obj, bytes) and len(obj) == view.nbytes else view.tobytes()


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def read_request(
    stream: BinaryIO, area: mmap.mmap | None = None
) -> tuple[bytes, list[bytes]] | None:
    """A request's pickle and its out-of-band buffers (from the pipe, or copied out of their
    slot of ``area``); ``None`` at the end of the input."""
    head = _read_exactly(stream, HEAD.size)
    if head is None:
        return None
    length, count, slot = HEAD.unpack(head)
    sizes = _read_exactly(stream, count * LENGTH.size)
    body = _read_exactly(stream, length)
    if sizes is None or body is None:
        return None
    buffers = []
    at = slot * SLOT_BYTES
    for (size,) in LENGTH.iter_unpack(sizes):
        if slot == IN_PIPE:
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


def pickled_error(e: Exception) -> bytes:
    """``e`` pickled for the daemon, or, if it does not pickle, a :class:`WorkerError` with its
    text."""
    try:
        return pickle.dumps(e, pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle still reaches the daemon, as text
        error = WorkerError(f"in an encode worker: {type(e).__name__}: {e}")
        return pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
