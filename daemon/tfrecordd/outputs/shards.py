"""Shard files: naming, the hidden in-progress file, size-capped rotation, and publishing.

A shard is written under :func:`~tfrecordd.format.writer.inprogress_name` in its node's staging
folder, ``<output>/.unpublished/<node id>/`` (:func:`staging_dir`): on the file system of its final
name, so that publishing is one ``link`` (or ``rename``), and where no glob for finished shards
reaches. Every globber counts: TensorFlow's ``tf.io.gfile.glob``, ``tf.data.Dataset.list_files`` and
fsspec's ``glob`` do not skip hidden names, so an in-progress file beside the shards called
``.<name>.inprogress`` was matched by ``*.tfrecord*``. A staging name carries no shard suffix
either, so recursive globs (``**/*.tfrecord*``) miss it too. The shard is written through the
compressor, with every byte also fed to a SHA-256 digest. :meth:`OpenShard.finish` ends the
compressed stream, fsyncs and closes the file; publishing gives it its final name without ever
replacing another file, and the output directory is fsynced after.

Each node has a staging folder of its own, so several daemons can share one output directory:
recovery (:func:`leftovers`) discards only what its own node left.

Size cap: before a batch is written, the shard's bytes on disk plus
:meth:`Compressor.bound` of everything not yet flushed out of the compressor (the pending bytes
and the batch) must fit in ``max_shard_bytes``; when the pessimistic estimate does not fit, the
compressor is synced so the estimate becomes exact, and only then does the shard rotate. A batch
that arrives already compressed (a :class:`~tfrecordd.format.writer.Packed` unit) has an exact size.
So a shard exceeds ``max_shard_bytes`` only when one batch alone is larger than the cap.

Each record's offset (for the shard's manifest) is kept in memory only for the last
:data:`OFFSETS_IN_MEMORY` records; the rest wait beside the shard in a file of their own
(:func:`offsets_name`), eight bytes a record, until the manifest is written from them (a
manifest rebuilt at recovery from a published shard gathers its offsets the same way). A shard
of millions of records would otherwise hold its offsets (and its manifest's list of them) in
memory whole.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import re
import secrets
import time
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import BinaryIO

import crc32c

from tfrecordd.errors import DurabilityError
from tfrecordd.format.compress import Compressor
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.framing import extend_record_starts, framed_size
from tfrecordd.format.writer import INPROGRESS_SUFFIX, Framed, Packed, RecordWriter, inprogress_name
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.manifest import SUFFIX as MANIFEST_SUFFIX

OFFSETS_IN_MEMORY = 1 << 16
"""Record offsets a shard keeps in memory (512 KiB) before it appends them to its offsets file."""

STAGING_DIR = ".unpublished"
"""The hidden folder of a local output directory that holds, one subfolder per node id, the
shards being written. Its name matches no shard glob (``*.tfrecord*``, ``part-*``)."""

_STAGED = re.compile(r"\.[A-Za-z0-9_-]+" + re.escape(INPROGRESS_SUFFIX))


def staging_dir(directory: str, node_id: str) -> str:
    """Where node ``node_id`` writes shards that will be published in ``directory``."""
    return os.path.join(directory, STAGING_DIR, node_id)


def staged_path(staging: str, legacy: str, shard: str, roots: Sequence[str] = ()) -> str:
    """Where shard ``shard``'s in-progress file is: in the node's ``staging`` folder; in
    another node's folder beside it (the daemon ran under another ``node_id`` before, e.g. a
    container's host name); in a node folder under one of ``roots``, one or two levels down
    (an object store's staging root before the config had datasets, or after); or, for a
    commit journalled by a version before staging folders, under its old name in ``legacy``
    (beside the shards). Shard names are unique, so the first found is the one. Blocking."""
    name = inprogress_name(shard)
    staged = os.path.join(staging, name)
    if os.path.lexists(staged):
        return staged
    for folder in _node_folders(os.path.dirname(staging), roots):
        other = os.path.join(folder, name)
        if os.path.lexists(other):
            return other
    old = os.path.join(legacy, f".{shard}{INPROGRESS_SUFFIX}")
    return old if os.path.lexists(old) else staged


def _node_folders(root: str, roots: Sequence[str]) -> Iterator[str]:
    def subfolders(path: str) -> list[str]:
        try:
            return [os.path.join(path, n) for n in sorted(os.listdir(path))]
        except OSError:
            return []

    yield from subfolders(root)
    for extra in roots:
        for folder in subfolders(extra):
            yield folder
            yield from subfolders(folder)


def offsets_name(name: str) -> str:
    """The in-progress name of the file that gathers shard ``name``'s record offsets."""
    return inprogress_name(f"{name}.offsets")


def _legacy(node_id: str) -> re.Pattern[str]:
    """In-progress names older versions gave a node's files, beside the shards: ``.<shard
    name>[.offsets].inprogress`` or ``.<manifest name>.inprogress``, with ``node_id`` exactly
    where a shard name holds the node id (:class:`ShardNamer`): ``ingest`` is not ``ingest-01``."""
    suffixes = "|".join(re.escape(s) for s in sorted(SUFFIXES.values(), key=len, reverse=True))
    return re.compile(
        rf"\.[A-Za-z0-9_.-]+-\d{{8}}T\d{{6}}\.\d{{6}}Z-{re.escape(node_id)}-[0-9a-f]{{6}}-\d{{6}}"
        rf"(?:(?:{suffixes})(?:\.offsets)?|{re.escape(MANIFEST_SUFFIX)})"
        + re.escape(INPROGRESS_SUFFIX)
    )


def leftovers(staging: str, legacy: str, node_id: str) -> list[str]:
    """Paths of the in-progress files a stopped run of node ``node_id`` left: every in-progress
    name in its ``staging`` folder, and in ``legacy`` (where versions before staging folders
    wrote them) those whose name is this node's by its exact structure. Blocking."""

    def names(directory: str) -> list[str]:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []

    legacy_name = _legacy(node_id)
    found = [os.path.join(staging, n) for n in names(staging) if _STAGED.fullmatch(n)]
    found += [os.path.join(legacy, n) for n in names(legacy) if legacy_name.fullmatch(n)]
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Prefix:
    """How much of an open shard is durable, ending a compression unit: enough to finish the
    shard there after a crash (:func:`finish_prefix`)."""

    size: int
    """Bytes of the file."""
    records: int
    adler32: int
    """Adler-32 of the raw record stream up to there (zlib's trailer needs it)."""


def finish_prefix(
    fs: FileSystem, path: str, prefix: Prefix, compression: Compression, level: int | None
) -> None:
    """End the shard at ``path`` where ``prefix`` says it was durable: cut what was written
    after, end the compressed stream there, fsync. Blocking.

    Raises:
        DurabilityError: the file is shorter than the prefix (it was made durable: something
            else cut it), or the cut or fsync fails.
    """
    try:
        f = fs.open_existing(path)
    except OSError as e:
        raise DurabilityError(f"{path}: {e.strerror or e}") from e
    try:
        size = os.fstat(f.fileno()).st_size
        if size < prefix.size:
            raise DurabilityError(
                f"{path}: holds {size} bytes, fewer than the {prefix.size} made durable before; "
                "the file was cut by something other than tfrecordd"
            )
        fs.truncate(f, prefix.size)
        ending = Compressor.ending(compression, level, prefix.adler32)
        if ending:
            fs.write(f, ending)
        fs.fsync(f)
    except OSError as e:
        raise DurabilityError(f"{path}: {e.strerror or e}") from e
    finally:
        _close_quietly(f)


@dataclass(frozen=True, slots=True)
class FinishedShard:
    """A complete, fsynced, closed shard still under its in-progress name."""

    name: str
    """Where it is published, relative to its output: ``[<partition>/]<file name>``."""
    tmp_path: str
    records: int
    size: int
    raw_bytes: int
    sha256: str
    crc32c: int
    offsets: RecordOffsets
    """Offset of each record in the uncompressed record stream (the file itself for none)."""
    first_time: float
    last_time: float
    event_times: tuple[float, float] | None = None
    """The earliest and latest event time of its records (epoch seconds), where known."""


class ShardNamer:
    """Names that are unique across restarts and nodes and sort by creation time:
    ``<prefix>-<UTC time>-<node>-<run id>-<seq><suffix>``."""

    def __init__(self, prefix: str, node_id: str, compression: Compression) -> None:
        self.prefix = prefix
        self.node_id = node_id
        self.suffix = SUFFIXES[compression]
        self.run_id = secrets.token_hex(3)
        self.seq = 0

    def next(self) -> str:
        self.seq += 1
        now = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        return f"{self.prefix}-{now}-{self.node_id}-{self.run_id}-{self.seq:06d}{self.suffix}"


class _Sink:
    """Where a shard's writer puts its bytes: the file, its digests and its size.

    An object of its own, not a method of the shard: a shard whose writer held the shard would
    be a reference cycle, and every finished shard (its compressor's state, its record offsets:
    megabytes) would wait for the garbage collector's rare full passes. Measured before this:
    the daemon's memory grew from 45 to 120 MB over 9 million events."""

    __slots__ = ("crc", "digest", "file", "fs", "size")

    def __init__(self, fs: FileSystem, file: BinaryIO) -> None:
        self.fs, self.file = fs, file
        self.digest = hashlib.sha256()
        self.crc = 0
        self.size = 0

    def __call__(self, data: bytes) -> None:
        self.fs.write(self.file, data)
        self.digest.update(data)
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += len(data)


def _close_quietly(f: BinaryIO) -> None:
    with contextlib.suppress(OSError):
        f.close()


class RecordOffsets:
    """Where each record of a shard starts in its uncompressed record stream, in order: the
    last :data:`OFFSETS_IN_MEMORY` in memory, the ones before in a file of their own (native
    ``uint64``), created at ``path`` when first needed. Blocking."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self._fs = fs
        self.path = path
        self._tail: array[int] = array("Q")
        self._file: BinaryIO | None = None
        self._spilled = 0

    def __len__(self) -> int:
        return self._spilled + len(self._tail)

    @property
    def in_memory(self) -> int:
        """How many of the offsets are held in memory (the rest are in the file)."""
        return len(self._tail)

    def extend(self, lengths: array[int], start: int) -> None:
        """Add the offsets of records of ``lengths`` (framed one after another from ``start``)."""
        extend_record_starts(self._tail, lengths, start)
        if len(self._tail) >= OFFSETS_IN_MEMORY:
            if self._file is None:
                # A copy left by a crash (a manifest rebuilt at recovery reuses the name) goes.
                self._fs.remove(self.path)
                self._file = self._fs.create_exclusive(self.path)
            self._fs.write(self._file, self._tail.tobytes())
            self._spilled += len(self._tail)
            del self._tail[:]

    def close(self) -> None:
        """Close the file (no more offsets come); :meth:`chunks` can then read them."""
        if self._file is not None:
            f, self._file = self._file, None
            self._fs.close(f)

    def chunks(self) -> Iterator[array[int]]:
        """All the offsets, in order, a bounded chunk at a time (after :meth:`close`)."""
        if self._spilled:
            with open(self.path, "rb") as f:
                while data := f.read(OFFSETS_IN_MEMORY * 8):
                    chunk: array[int] = array("Q")
                    chunk.frombytes(data)
                    yield chunk
        if self._tail:
            yield self._tail

    def remove(self) -> None:
        """Close and delete the file, if there is one (errors closing it ignored)."""
        if self._file is not None:
            _close_quietly(self._file)
            self._file = None
        self._fs.remove(self.path)


class OpenShard:
    """One shard being written. Blocking: call it from a worker thread. ``track_offsets``:
    keep each record's offset (for the manifest); without it :attr:`offsets` stays empty."""

    def __init__(
        self,
        directory: str,
        name: str,
        compression: Compression,
        level: int | None,
        max_bytes: int,
        fs: FileSystem,
        *,
        track_offsets: bool = True,
        folder: str = "",
        executor: Executor | None = None,
    ) -> None:
        self.directory = directory
        self.file_name = name
        self.folder = folder
        self.name = f"{folder}/{name}" if folder else name
        """Where it is published, relative to its output (``[<partition>/]<file name>``)."""
        self.compression = compression
        self.level = level
        self.max_bytes = max_bytes
        self.fs = fs
        self.tmp_path = os.path.join(directory, inprogress_name(name))
        spill = os.path.join(directory, offsets_name(name))
        self.offsets = RecordOffsets(fs, spill)
        self.track_offsets = track_offsets
        self.first_time = self.last_time = 0.0
        self.event_times: tuple[float, float] | None = None
        self.marked: Prefix | None = None
        """The prefix last marked (:meth:`mark`), if any: a commit's intent may name it."""
        self._dir_synced = False
        self._file: BinaryIO | None = fs.create_exclusive(self.tmp_path)
        self._out = _Sink(fs, self._file)
        self._writer = RecordWriter(self._out, compression, level=level, executor=executor)

    @property
    def file_bytes(self) -> int:
        """Bytes in the file so far."""
        return self._out.size

    @property
    def records(self) -> int:
        return self._writer.records

    @property
    def raw_bytes(self) -> int:
        return self._writer.raw_bytes

    def pending_bound(self) -> int:
        """The most bytes what was written may yet add to the file (compressed, ended)."""
        return self._writer.pending_bound()

    def fits(self, batch: list[bytes] | Packed | Framed) -> bool:
        """Whether a batch (records, or records already packed into a unit) fits under the size
        cap, syncing the compressor if that is what makes it fit."""
        if self.records == 0:
            return True
        bound = Compressor.bound
        c = self.compression
        writer = self._writer
        if isinstance(batch, Packed) and batch.unit.compression is c:
            # The unit's size is known; the stream's ending (a zlib trailer) is all that may follow.
            incoming = len(batch.unit.data) + bound(c, 0)
            if self.file_bytes + writer.pending_bound() + incoming <= self.max_bytes:
                return True
            writer.sync()
            return self.file_bytes + incoming <= self.max_bytes
        if isinstance(batch, list):
            raw = framed_size(batch)
        else:
            raw = batch.raw_size if isinstance(batch, Framed) else batch.unit.raw_size
        if self.file_bytes + writer.pending_bound(raw) <= self.max_bytes:
            return True
        self._writer.sync()
        return self.file_bytes + bound(c, raw) <= self.max_bytes

    def collect(self) -> None:
        """Write the units compressed in the executor so far (see
        :meth:`RecordWriter.collect <tfrecordd.format.writer.RecordWriter.collect>`)."""
        self._writer.collect()

    @property
    def dirty(self) -> bool:
        """Whether records were written since the last :meth:`mark`."""
        return self.records > (self.marked.records if self.marked else 0)

    def mark(self) -> Prefix:
        """End the compression unit where the shard is: the prefix written so far could end
        the shard (:func:`finish_prefix`) once :meth:`make_durable` returns. The shard stays
        open."""
        adler = self._writer.checkpoint()
        self.marked = Prefix(self.file_bytes, self.records, adler)
        return self.marked

    def make_durable(self, *, fsync: bool = True) -> None:
        """fsync what is written (the first time, the staging folder too: the in-progress name
        an intent holds must survive a crash). Safe while another thread goes on writing: only
        what was written before is promised. Any failure here is final for this file."""
        if not fsync:
            return
        f = self._file
        assert f is not None
        try:
            self.fs.fsync(f)
            if not self._dir_synced:
                self.fs.fsync_dir(os.path.dirname(self.tmp_path))
                self._dir_synced = True
        except OSError as e:
            raise DurabilityError(f"{self.tmp_path}: {e.strerror or e}") from e

    def write(
        self, batch: list[bytes] | Packed | Framed, event_times: tuple[float, float] | None = None
    ) -> None:
        """Append a batch: records, or records :func:`~tfrecordd.format.writer.pack` made into a
        unit (or framed, several units as one :class:`~tfrecordd.format.writer.Framed`);
        ``event_times``: the earliest and latest event time among them, if known."""
        if event_times is not None:
            lo, hi = event_times
            if self.event_times is not None:
                lo, hi = min(lo, self.event_times[0]), max(hi, self.event_times[1])
            self.event_times = (lo, hi)
        if self.track_offsets:
            start = self._writer.raw_bytes
            if isinstance(batch, Framed):
                for unit in batch.units:
                    self.offsets.extend(unit.lengths, start)
                    start += unit.unit.raw_size
            else:
                lengths = (
                    batch.lengths if isinstance(batch, Packed) else array("Q", map(len, batch))
                )
                self.offsets.extend(lengths, start)
        self.last_time = time.time()
        if not self.first_time:
            self.first_time = self.last_time
        if isinstance(batch, list):
            self._writer.write_many(batch)
        else:
            self._writer.write_packed(batch)

    def finish(self, *, fsync: bool = True) -> FinishedShard:
        """End the stream, fsync and close. Any failure here is final for this file."""
        assert self._file is not None
        f = self._file
        try:
            self._writer.finish()
            if fsync:
                self.fs.fsync(f)
                # The in-progress entry is durable before the intent names it: recovery reads
                # an intent whose in-progress file is gone as a shard published and moved away.
                self.fs.fsync_dir(os.path.dirname(self.tmp_path))
        except OSError as e:
            self._file = None
            _close_quietly(f)
            raise DurabilityError(f"{self.tmp_path}: {e.strerror or e}") from e
        self._file = None
        try:
            self.fs.close(f)
            self.offsets.close()
        except OSError as e:
            raise DurabilityError(f"{self.tmp_path}: close failed: {e.strerror or e}") from e
        return FinishedShard(
            name=self.name,
            tmp_path=self.tmp_path,
            records=self.records,
            size=self.file_bytes,
            raw_bytes=self.raw_bytes,
            sha256=self._out.digest.hexdigest(),
            crc32c=self._out.crc,
            offsets=self.offsets,
            first_time=self.first_time,
            last_time=self.last_time,
            event_times=self.event_times,
        )

    def leave(self) -> None:
        """Close the file (errors ignored), keeping it for the next start: a commit may hold a
        prefix of it. Its offsets' file goes (recovery measures the shard again)."""
        if self._file is not None:
            _close_quietly(self._file)
            self._file = None
        self.offsets.remove()

    def discard(self) -> None:
        """Close (errors ignored) and remove the in-progress file and its offsets' file."""
        if self._file is not None:
            _close_quietly(self._file)
            self._file = None
        self.offsets.remove()
        self.fs.remove(self.tmp_path)
