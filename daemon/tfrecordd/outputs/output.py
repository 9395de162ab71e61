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
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, TypeVar

from tfrecordd import crashpoints
from tfrecordd.errors import DurabilityError
from tfrecordd.format.writer import inprogress_name
from tfrecordd.fsys import FileSystem, write_file
from tfrecordd.outputs.shards import FinishedShard, staging_dir
from tfrecordd.state.records import Intent

_T = TypeVar("_T")


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

    @abc.abstractmethod
    def final_path(self, name: str) -> str:
        """Where the shard called ``name`` is published."""

    @abc.abstractmethod
    def publish(self, shard: FinishedShard) -> None:
        """Make a finished (complete, fsynced, closed) shard visible under its final name,
        atomically and durably; never replace an existing shard. Blocking."""

    @abc.abstractmethod
    def is_published(self, intent: Intent) -> bool:
        """Whether the intent's shard is published (recovery; blocking)."""

    @abc.abstractmethod
    def publish_sidecar(self, name: str, parts: Iterable[bytes]) -> None:
        """Publish a file beside the shards (a shard's manifest) atomically and durably,
        replacing any earlier copy (it is rewritten whole after a crash). ``parts`` are its
        bytes, read once, in order, and written as they come: the file is never whole in
        memory. Blocking."""

    @abc.abstractmethod
    def sidecar_exists(self, name: str) -> bool:
        """Whether the small file ``name`` is published (recovery; blocking)."""

    def sync(self) -> None:  # noqa: B027
        """Make every shard published so far durable (recovery calls it before redoing the
        acks of shards published just before a crash). Default: nothing to do."""

    def read_published(self, name: str, read: Callable[[BinaryIO], _T]) -> _T:
        """``read(stream)`` over the published file ``name``, read from its start (recovery
        rebuilding a manifest; blocking). Retried whole where reading can fail transiently."""
        with open(self.final_path(name), "rb") as f:
            return read(f)

    def resume(self, intent: Intent, staged: str) -> bool:
        """Finish publishing an intent's shard from its staged copy at ``staged`` if the copy
        is complete; return whether it is now published. Default: cannot resume."""
        del intent, staged
        return False

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

    def __init__(self, directory: str, fs: FileSystem, *, node_id: str, fsync: bool = True) -> None:
        self.location = self.legacy_dir = os.path.abspath(directory)
        self.staging_dir = staging_dir(self.location, node_id)
        self.fs = fs
        self.fsync = fsync

    def final_path(self, name: str) -> str:
        return os.path.join(self.location, name)

    def publish(self, shard: FinishedShard) -> None:
        try:
            self.fs.publish(shard.tmp_path, self.final_path(shard.name))
            crashpoints.reached("after-publish")
            if self.fsync:
                self.fs.fsync_dir(self.location)
        except OSError as e:
            raise DurabilityError(f"publishing {shard.name}: {e.strerror or e}") from e
        crashpoints.reached("after-dir-fsync")

    def is_published(self, intent: Intent) -> bool:
        return intent.shard is not None and os.path.lexists(self.final_path(intent.shard))

    def sync(self) -> None:
        # The output directory holds the published names; the staging folder the removal of
        # the in-progress names recovery discarded.
        if self.fsync:
            for directory in (self.location, self.staging_dir):
                try:
                    self.fs.fsync_dir(directory)
                except OSError as e:
                    raise DurabilityError(f"{directory}: fsync: {e.strerror or e}") from e

    def publish_sidecar(self, name: str, parts: Iterable[bytes]) -> None:
        try:
            tmp = stage(self.fs, self.staging_dir, name, parts, fsync=self.fsync)
            self.fs.replace(tmp, self.final_path(name))
            if self.fsync:
                self.fs.fsync_dir(self.location)
        except OSError as e:
            raise DurabilityError(f"publishing {name}: {e.strerror or e}") from e

    def sidecar_exists(self, name: str) -> bool:
        return os.path.exists(self.final_path(name))


def stage(fs: FileSystem, directory: str, name: str, parts: Iterable[bytes], *, fsync: bool) -> str:
    """Write ``parts`` to the in-progress name of ``name`` in ``directory`` (replacing a copy
    left by a crash), fsync it if asked, close it; return its path. The file is removed again
    if writing it fails."""
    tmp = os.path.join(directory, inprogress_name(name))
    write_file(fs, tmp, parts, fsync=fsync)
    return tmp
