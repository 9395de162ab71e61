"""Reading one claimed spool file: its decompressed bytes, without blocking the event loop.

:class:`FileReader` opens a file in the claim folder relative to the folder's descriptor (never
following a symlink, only a regular file), reads it through aiofiles (a plain file) or a
decompressing stream in a worker thread (``.gz``, ``.zst``; up to
``max_decompressed_bytes``), seeks to a committed offset in the
decompressed stream, and notices a file that changes while it is read. Whatever cannot be read
on to the end raises :class:`Rejected`, so the source moves the file aside instead of deleting a
tail nobody read.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import suppress
from typing import Any, Protocol

import aiofiles
import anyio

from tfrecordd.format import compiled
from tfrecordd.format.compression import Compression
from tfrecordd.format.decompress import open_decompressed
from tfrecordd.plugin import CompressionError

GROW_POLLS = 10
"""A file still growing this many poll intervals after it was first read to its end has the
rest refused."""
_F_SETSIG = 10
"""Linux's ``F_SETSIG`` (the :mod:`fcntl` module does not name it)."""
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SUFFIX_COMPRESSION = {".gz": Compression.GZIP, ".zst": Compression.ZSTD, ".zstd": Compression.ZSTD}


TAIL_BYTES = 4096
"""How many of a file's last bytes (as read) :func:`tail_digest` covers."""


def tail_digest(fd: int, size: int) -> int:
    """CRC-32C of the ``TAIL_BYTES`` before offset ``size`` of the file ``fd``: whether the
    bytes a reading ended on are still there (an append keeps them, a rewrite rarely does, even
    one of the same size within the file system's timestamp granularity)."""
    start = max(0, size - TAIL_BYTES)
    return compiled.crc32c(os.pread(fd, size - start, start)) if size else 0


def take_lease(fd: int) -> bool | None:
    """Take a read lease on ``fd``: ``True`` if taken (no process has the file open for
    writing, and none can open it so until the lease is released), ``False`` if a writer has
    it open, ``None`` where leases are not to be had (another user's file without
    ``CAP_LEASE``, a file system without them, not Linux): then the size and modification time
    are all that is checked. A writer that opens the file while the lease is held waits for its
    release; the kernel tells the holder with ``SIGURG`` (ignored by default) instead of
    ``SIGIO`` (which would end the process)."""
    if sys.platform != "linux":
        return None
    try:
        fcntl.fcntl(fd, _F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EBUSY):
            return False
        return None
    return True


def release_lease(fd: int) -> None:
    """Release the lease :func:`take_lease` took on ``fd``."""
    with suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def no_writer(fd: int) -> bool:
    """Whether no process has the file ``fd`` open for writing (a read lease taken and
    released at once); ``False`` where that cannot be known."""
    if take_lease(fd):
        release_lease(fd)
        return True
    return False


class ReadSettings(Protocol):
    """The source settings a :class:`FileReader` follows (the directory source's config)."""

    @property
    def read_size(self) -> int: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def max_decompressed_bytes(self) -> int: ...


class Rejected(Exception):
    """The rest of the input cannot be read; the file is moved aside."""


def _cut(size: int, offset: int) -> str:
    return (
        f"the file was cut to {size} bytes after its first {offset} were read and published; "
        "what it holds now is kept, not read"
    )


def compression_of(name: str, configured: str) -> Compression:
    """How the file ``name`` is compressed: ``configured``, or by its suffix for ``auto``."""
    if configured != "auto":
        return Compression(configured)
    return _SUFFIX_COMPRESSION.get(os.path.splitext(name)[1], Compression.NONE)


class FileReader:
    """Decompressed bytes of one claimed file, read without blocking the event loop.

    A file that changes after it was opened (a producer still writing into a published file)
    is noticed at the end of what was read, by its size and modification time: a plain file is
    read on while it grows (until it has been still for a poll interval, for at most
    ``GROW_POLLS`` poll intervals); a compressed one, or one that keeps growing, has the rest
    refused (:class:`Rejected`), so the file is moved aside rather than deleted with a tail
    nobody read."""

    def __init__(
        self, folder: int, name: str, compression: Compression, config: ReadSettings
    ) -> None:
        self.folder = folder
        self.name = name
        self.compression = compression
        self.config = config
        self.grew = False
        """Whether the file changed after it was opened (or ``seen``)."""
        self.expect: tuple[int, int] | None = None
        """The size and :func:`tail_digest` the file had when reading last stopped (a claim
        renamed to be read on): checked before reading resumes."""
        self.seen: tuple[int, int] | None = None
        """The file's size and modification time when it was claimed, if known: a change
        since then is noticed too."""
        self._plain: Any = None
        self._raw: Any = None
        self._stream: Any = None
        self._at_end = False
        self._fd = -1
        self._pos = 0  # of a plain file: where the next read starts
        self._seen = (0, 0)  # size and modification time at the last look
        self._tail = 0  # tail_digest at the end of reading
        self._grew_at = 0.0
        self._still = False  # looked again after a poll interval: nothing changed

    def _opener(self, name: str, flags: int) -> int:
        return os.open(name, flags | _FILE_FLAGS, dir_fd=self.folder)

    async def open(self) -> None:
        if self.compression is Compression.NONE:
            self._plain = await aiofiles.open(self.name, "rb", opener=self._opener)
            fd = self._plain.fileno()
        else:
            self._raw = await anyio.to_thread.run_sync(self._open_raw)
            fd = self._raw.fileno()
            self._stream = open_decompressed(
                self._raw,
                self.compression,
                path=self.name,
                max_bytes=self.config.max_decompressed_bytes,
            )
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            await self.close()
            raise Rejected("not a regular file")
        self._fd = fd
        self._seen = self.seen or (st.st_size, st.st_mtime_ns)

    @property
    def last_seen(self) -> tuple[int, int, int]:
        """The file's size, modification time (ns) and :func:`tail_digest` at the end of what
        was read: what finishing the file checks it against."""
        return (*self._seen, self._tail)

    def _open_raw(self) -> Any:
        return open(self.name, "rb", buffering=0, opener=self._opener)

    async def seek(self, offset: int) -> None:
        """Read from ``offset`` (in the decompressed stream) on; a compressed stream is read up
        to it. A file that ends before ``offset`` was cut after its first ``offset`` bytes were
        read and published: :class:`Rejected` (it is kept, not finished as if read)."""
        self._at_end = False
        if self.expect is not None:
            await self._check_expected(*self.expect)
        if self._plain is not None:
            if offset:
                if (size := os.fstat(self._fd).st_size) < offset:
                    raise Rejected(_cut(size, offset))
                await self._plain.seek(offset)
            self._pos = offset
            return
        size, left = self.config.read_size, offset
        while left > 0:
            skipped = await self._decompressed(min(size, left))
            if not skipped:
                raise Rejected(_cut(offset - left, offset))
            left -= len(skipped)

    async def _check_expected(self, size: int, digest: int) -> None:
        """The file still holds the bytes read before (its first ``size``, their tail's
        digest): else it was cut or rewritten since, and the rest is refused."""
        now = os.fstat(self._fd).st_size
        if now < size:
            raise Rejected(_cut(now, size))
        if await anyio.to_thread.run_sync(tail_digest, self._fd, size) != digest:
            raise Rejected(
                f"the file was rewritten after its first {size} bytes were read and published "
                "(the bytes they ended on differ); what it holds now is kept, not read"
            )

    async def read(self) -> bytes:
        """The next bytes, up to ``read_size``; ``b""`` at the end."""
        size = self.config.read_size
        while True:
            if not self._at_end:
                if self._plain is None:
                    chunk = await self._decompressed(size)
                else:
                    chunk = await self._plain.read(size)
                    self._pos += len(chunk)
                # A read returns less than asked only at the end of the file: no trip to a
                # thread to hear that again.
                self._at_end = len(chunk) < size
                if chunk:
                    return chunk
            if not await self._more():
                return b""
            self._at_end = False

    async def read_into(self, target: memoryview) -> int:
        """Read the next bytes into ``target``; how many (``0`` at the end)."""
        while True:
            if not self._at_end:
                if self._plain is None:
                    chunk = await self._decompressed(len(target))
                    got = len(chunk)
                    target[:got] = chunk
                else:
                    got = await self._plain.readinto(target)
                    self._pos += got
                self._at_end = got < len(target)
                if got:
                    return got
            if not await self._more():
                return 0
            self._at_end = False

    async def _more(self) -> bool:
        """At the end of what was read: whether the file grew since, so reading goes on."""
        while True:
            st = os.fstat(self._fd)
            now = (st.st_size, st.st_mtime_ns)
            if now == self._seen:
                if not self.grew or self._still:
                    # What the end of reading saw, for finishing to compare the file with.
                    self._tail = await anyio.to_thread.run_sync(tail_digest, self._fd, now[0])
                    st = os.fstat(self._fd)
                    if (st.st_size, st.st_mtime_ns) == now:
                        return False
                    continue
                # It changed before: let a writer that is still at it show itself.
                await anyio.sleep(self.config.poll_interval)
                self._still = True
                continue
            self._seen, self._still = now, False
            if not self.grew:
                self.grew, self._grew_at = True, time.monotonic()
            if self._plain is None:
                raise Rejected(
                    "the file changed while it was read (published before it was complete); "
                    "the rest is not read"
                )
            if st.st_size < self._pos:
                raise Rejected(f"the file was cut to {st.st_size} bytes while it was read")
            if time.monotonic() - self._grew_at > GROW_POLLS * self.config.poll_interval:
                raise Rejected(
                    f"still being written {GROW_POLLS} poll intervals after it was read to its "
                    f"end; the rest, from byte {self._pos}, is not read"
                )
            if st.st_size > self._pos:
                return True

    async def written_out(self) -> bool:
        """At the end of what was read: whether no process has the file open for writing any
        more (:func:`no_writer`), so a last line without a line end is all there will be."""
        return await anyio.to_thread.run_sync(no_writer, self._fd)

    async def chunks(self, offset: int) -> AsyncGenerator[bytes, None]:
        """The bytes from ``offset`` (in the decompressed stream) to the end."""
        await self.seek(offset)
        while chunk := await self.read():
            yield chunk

    async def _decompressed(self, size: int) -> bytes:
        try:
            chunk: bytes = await anyio.to_thread.run_sync(self._stream.read, size)
        except CompressionError as e:
            raise Rejected(e.detail) from e
        return chunk

    async def close(self) -> None:
        if self._plain is not None:
            await self._plain.close()
            self._plain = None
        if self._raw is not None:
            await anyio.to_thread.run_sync(self._raw.close)
            self._raw = self._stream = None
