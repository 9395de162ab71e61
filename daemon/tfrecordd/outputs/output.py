"""Where published shards go: a local directory, or any fsspec file system (object stores).

The committer writes each shard as an in-progress file in :attr:`Output.staging_dir` (its
node's own folder, out of the reach of readers' globs), fsyncs it, journals the intent, then
calls :meth:`Output.publish`. Only when that returns are the sources acknowledged. At start-up,
:meth:`Output.is_published` and :meth:`Output.resume` decide, for each journalled intent without
``done``, whether its acks are redone, its publishing is finished from the staged copy, or it is
dropped (its events replay from the sources); a shard moved away after it was published is
known from its intent (see :mod:`tfrecordd.pipeline.recovery`).
"""

from __future__ import annotations

import abc
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, TypeVar

from tfrecordd import crashpoints
from tfrecordd.errors import DurabilityError
from tfrecordd.format.compression import SUFFIXES
from tfrecordd.format.writer import inprogress_name
from tfrecordd.fsys import FileSystem, write_file
from tfrecordd.outputs.shards import FinishedShard, staging_dir
from tfrecordd.state.records import ShardRef

_T = TypeVar("_T")

DURABLE_FOLDERS = 4096
"""Partition folders a local output remembers as durable; one forgotten costs an fsync of its
parent the next time a shard is published in it."""


class Output(abc.ABC):
    """A destination for finished shards."""

    staging_dir: str
    """Local directory where this node writes shards (and stages sidecars) while in progress;
    no other daemon writes there."""
    legacy_dir: str
    """Where versions before per-node staging folders wrote in-progress files: recovery still
    discards this node's there."""
    location: str
    """Where shards are published, for logs (a directory or a URL)."""
    staging_roots: tuple[str, ...] = ()
    """Other folders whose node folders may hold this output's staged shards: where a config
    of another form staged them (recovery looks there too)."""

    concurrent_publish: bool = False
    """Whether :meth:`publish` and :meth:`publish_sidecar` may be called for several shards
    at once, from several threads (a commit then publishes its shards together)."""

    @abc.abstractmethod
    def final_path(self, name: str) -> str:
        """Where the shard called ``name`` is published."""

    @abc.abstractmethod
    def publish(self, shard: FinishedShard) -> None:
        """Make a finished (complete, fsynced, closed) shard visible under its final name,
        atomically and durably; never replace an existing shard. Blocking."""

    @abc.abstractmethod
    def is_published(self, shard: ShardRef) -> bool:
        """Whether ``shard`` is published (recovery; blocking)."""

    @abc.abstractmethod
    def publish_sidecar(self, name: str, parts: Iterable[bytes]) -> None:
        """Publish a file beside the shards (a shard's manifest) atomically and durably,
        replacing any earlier copy (it is rewritten whole after a crash). ``parts`` are its
        bytes, read once, in order, and written as they come: the file is never whole in
        memory. Blocking."""

    @abc.abstractmethod
    def sidecar_exists(self, name: str) -> bool:
        """Whether the small file ``name`` is published (recovery; blocking)."""

    @abc.abstractmethod
    def list_shards(self, folder: str) -> list[str]:
        """The published shards under the partition folder ``folder`` (relative; ``""``: the
        whole output), at any depth, as names relative to the output, sorted; folders and
        files whose name starts with ``.`` or ``_`` are left out (staging, markers, the late
        tree). Blocking."""

    def sync(self, folders: Iterable[str] = ()) -> None:  # noqa: B027
        """Make every shard published so far in the output's top folder and in ``folders``
        (partition folders, relative) durable: recovery calls it before redoing the acks of
        shards published just before a crash. Default: nothing to do."""

    def read_published(self, name: str, read: Callable[[BinaryIO], _T]) -> _T:
        """``read(stream)`` over the published file ``name``, read from its start (recovery
        rebuilding a manifest; blocking). Retried whole where reading can fail transiently."""
        with open(self.final_path(name), "rb") as f:
            return read(f)

    def resume(self, shard: FinishedShard) -> None:
        """Publish a shard a stopped run left staged, complete (recovery; blocking). Default:
        :meth:`publish`."""
        self.publish(shard)

    def redact(self) -> dict[str, Any]:
        """A description for logs and ``check-config`` without secrets."""
        return {"location": self.location}

    def stop_retrying_at(self, deadline: float) -> None:  # noqa: B027
        """Give up retrying publishes at ``deadline`` (``time.monotonic()``): the daemon is
        draining, and an upload may wait no longer than the drain. May be called from any
        thread. Default: nothing is retried, so nothing to cut."""


class LocalOutput(Output):
    """A local directory: shards are written in ``<directory>/.unpublished/<node_id>/`` and
    published by ``link`` + ``unlink`` into the directory (one file system), which is then
    fsynced."""

    concurrent_publish = True

    def __init__(self, directory: str, fs: FileSystem, *, node_id: str, fsync: bool = True) -> None:
        self.location = self.legacy_dir = os.path.abspath(directory)
        self.staging_dir = staging_dir(self.location, node_id)
        self.fs = fs
        self.fsync = fsync
        # Held while partition folders are made: a shard published at once with another must
        # not find a folder whose entry that other has yet to make durable.
        self._folders = threading.Lock()
        self._durable: OrderedDict[str, None] = OrderedDict()
        """Partition folders (relative) whose entries this process made durable, most recently
        used last (at most :data:`DURABLE_FOLDERS`)."""
        self._folder_error: OSError | None = None

    def final_path(self, name: str) -> str:
        return os.path.join(self.location, name)

    def publish(self, shard: FinishedShard) -> None:
        final = self.final_path(shard.name)
        try:
            self._make_folder(os.path.dirname(shard.name))
            self.fs.publish(shard.tmp_path, final)
            crashpoints.reached("after-publish")
            if self.fsync:
                self.fs.fsync_dir(os.path.dirname(final))
        except OSError as e:
            raise DurabilityError(f"publishing {shard.name}: {e.strerror or e}") from e
        crashpoints.reached("after-dir-fsync")

    def resume(self, shard: FinishedShard) -> None:
        if os.path.lexists(self.final_path(shard.name)):
            # Linked before the crash; its in-progress name only was left.
            self.fs.remove(shard.tmp_path)
            if self.fsync:
                self.fs.fsync_dir(self.staging_dir)
            return
        self.publish(shard)

    def _make_folder(self, folder: str) -> None:
        """Create the partition folder ``folder`` (relative) where missing, and make each
        level's entry durable in its parent before a shard is published in it: a level made
        here, and once per start a level found there (a crash between a ``mkdir`` and its
        parent's fsync leaves a folder whose entry a power cut would still take). A failed
        fsync of a parent fails every later call too: no shard goes into a folder that may not
        be durable."""
        if not folder:
            return
        parts = folder.split("/")
        with self._folders:
            if self._folder_error is not None:
                e = self._folder_error
                raise OSError(e.errno, f"a partition folder's fsync failed before: {e.strerror}")
            for depth in range(1, len(parts) + 1):
                level = "/".join(parts[:depth])
                path = os.path.join(self.location, *parts[:depth])
                try:
                    os.mkdir(path)
                except FileExistsError:
                    if level in self._durable:
                        self._durable.move_to_end(level)
                        continue
                if self.fsync:
                    try:
                        self.fs.fsync_dir(os.path.dirname(path))
                    except OSError as e:
                        self._folder_error = e
                        raise
                self._durable[level] = None
                if len(self._durable) > DURABLE_FOLDERS:
                    self._durable.popitem(last=False)

    def is_published(self, shard: ShardRef) -> bool:
        return os.path.lexists(self.final_path(shard.name))

    def list_shards(self, folder: str) -> list[str]:
        found: list[str] = []
        top = self.final_path(folder) if folder else self.location
        for here, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            rel = os.path.relpath(here, self.location)
            found += [f if rel == "." else f"{rel}/{f}" for f in files if is_shard_name(f)]
        return sorted(found)

    def sync(self, folders: Iterable[str] = ()) -> None:
        # The output's folders hold the published names; the staging folder the removal of
        # the in-progress names recovery discarded.
        if self.fsync:
            inner = sorted({os.path.join(self.location, f) for f in folders if f})
            for directory in (self.location, *inner, self.staging_dir):
                try:
                    self.fs.fsync_dir(directory)
                except OSError as e:
                    raise DurabilityError(f"{directory}: fsync: {e.strerror or e}") from e

    def publish_sidecar(self, name: str, parts: Iterable[bytes]) -> None:
        final = self.final_path(name)
        try:
            self._make_folder(os.path.dirname(name))
            tmp = stage(self.fs, self.staging_dir, name, parts, fsync=self.fsync)
            self.fs.replace(tmp, final)
            if self.fsync:
                self.fs.fsync_dir(os.path.dirname(final))
        except OSError as e:
            raise DurabilityError(f"publishing {name}: {e.strerror or e}") from e

    def sidecar_exists(self, name: str) -> bool:
        return os.path.exists(self.final_path(name))


def is_shard_name(name: str) -> bool:
    """Whether a file name is a published shard's: a shard suffix, and not hidden or
    ``_``-prefixed."""
    return not name.startswith((".", "_")) and name.endswith(tuple(SUFFIXES.values()))


def stage(fs: FileSystem, directory: str, name: str, parts: Iterable[bytes], *, fsync: bool) -> str:
    """Write ``parts`` to the in-progress name of ``name`` (its file name: ``name`` may hold a
    partition folder) in ``directory`` (replacing a copy left by a crash), fsync it if asked,
    close it; return its path. The file is removed again if writing it fails."""
    tmp = os.path.join(directory, inprogress_name(os.path.basename(name)))
    write_file(fs, tmp, parts, fsync=fsync)
    return tmp
