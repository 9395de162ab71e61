"""Spool-directory source: the ``directory`` plugin's config, and the source that wires its parts.

Producers publish a file into the spool by renaming it to a name that matches ``pattern``. The
source claims each new file by renaming it into its node's claim folder,
``<path>/.tfrecordd-claimed/<node_id>/`` (locked while it runs: a second daemon with the same
``node_id`` on the spool stops with exit 75), reads it in batches whose tokens carry the offset
after their last record, and deletes it (or moves it into ``done_dir``; one that could not be
read to its end into ``.tfrecordd-rejected/``) only once every record from it is in a published
shard, so delivery is exactly once, also with several daemons on one spool. The parts, each in
a module of its own: :mod:`.spool_folders` (folders below the spool, never through a symlink),
:mod:`.spool_names` (claim names), :mod:`.spool_held` (the folders held open, and their watch),
:mod:`.spool_claims` (claiming), :mod:`.spool_finish` (finishing: deleting, moving, setting
aside, or reading on a file that changed since it was read),
:mod:`.spool_positions` (tokens and committed offsets), :mod:`.spool_reading` (one file's bytes,
decompressed) and :mod:`.spool_formats` (``jsonl``, ``csv`` and ``whole-file`` batches).
"""

from __future__ import annotations

import codecs
import errno
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
from pydantic import Field, field_validator

from tfrecordd.plugin import (
    DirectoryUse,
    Duration,
    InputBoundary,
    RawBatch,
    Refusals,
    Size,
    Source,
    SourceConfig,
    SourceContext,
    Token,
)
from tfrecordd_plugins.sources import spool_positions
from tfrecordd_plugins.sources.spool_claims import Claims
from tfrecordd_plugins.sources.spool_folders import SpoolError
from tfrecordd_plugins.sources.spool_formats import FormatReaders, reject
from tfrecordd_plugins.sources.spool_names import (
    CLAIM_DIR,
    NAME_MAX,
    REASONS,
    REJECT_DIR,
    is_final,
    original,
    printable,
    resume_check,
)
from tfrecordd_plugins.sources.spool_positions import Positions, SpoolToken
from tfrecordd_plugins.sources.spool_reading import (
    GROW_POLLS,
    FileReader,
    Rejected,
    compression_of,
)

__all__ = [
    "CLAIM_DIR",
    "GROW_POLLS",
    "NAME_MAX",
    "REASONS",
    "REJECT_DIR",
    "WATCH_INTERVAL",
    "DirectorySource",
    "DirectorySourceConfig",
    "SpoolError",
]

log = logging.getLogger(__name__)

_ASCII = "".join(map(chr, range(128)))
WATCH_INTERVAL = 1.0
"""Seconds between two checks that the spool's folders held open are still at their paths."""

_UNOPENABLE = {
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENXIO,
    errno.ENODEV,
    errno.EOPNOTSUPP,
}
"""Why a claimed file cannot be opened that waiting will not change: it is moved aside."""


class DirectorySourceConfig(SourceConfig):
    """``type = "directory"``: a spool directory of JSON-lines, CSV or whole files."""

    type: Literal["directory"] = "directory"
    path: Path
    """The spool directory to watch."""
    pattern: str = "*.jsonl"
    """Glob (``fnmatch``) that published files match; dotfiles and temporary names never do."""
    format: Literal["jsonl", "csv", "whole-file"] = "jsonl"
    """How a file splits into events: ``jsonl`` one JSON value per line; ``csv`` a header row,
    then one event per record (header name → text field); ``whole-file`` one event per file."""
    compression: Literal["auto", "none", "gzip", "zstd"] = "auto"
    """Compression of the input files; ``auto``: by suffix (``.gz``, ``.zst``/``.zstd``)."""
    max_decompressed_bytes: Size = Field(default=4 << 30, ge=1)
    """A compressed input that decompresses to more than this is rejected (dead-lettered and
    moved into ``.tfrecordd-rejected/``): the guard against decompression bombs."""
    recursive: bool = False
    """Also look in sub-folders (hidden ones, ``done_dir`` and symlinked folders excepted). With
    ``whole-file``, an event's label is the name of its parent folder (``cats/1.jpg`` → cats)."""
    on_done: Literal["delete", "move"] = "delete"
    """What happens to a file once all its records are published: deleted, or moved."""
    done_dir: Path | None = None
    """Where ``on_done = "move"`` puts finished files; default: ``done/`` inside ``path``."""
    poll_interval: Duration = Field(default=1.0, gt=0)
    """How often to look for new files when idle."""
    max_line_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer line (or CSV record) is dead-lettered with its first ``max_line_bytes`` bytes,
    never split."""
    max_file_bytes: Size = Field(default=64 << 20, ge=1)
    """``whole-file``: a larger file is dead-lettered (its path kept) and moved into
    ``.tfrecordd-rejected/``."""
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)
    """``csv``: the field delimiter: one ASCII character, not a quote or a line end."""
    csv_encoding: str = "utf-8"
    """``csv``: the files' text encoding, one that writes ASCII as ASCII: ``utf-8``, or
    ``cp1252`` for Excel's "CSV (Comma delimited)" on Windows, ``latin-1``, ``shift_jis``..."""
    read_size: Size = Field(default=1 << 20, ge=4096)
    """Bytes read from a file per read call. ``jsonl`` files are read into one buffer the
    source keeps, of ``read_size`` plus ``min(max_line_bytes, read_size)`` bytes."""

    delivery: ClassVar[str] = "exactly-once"
    crash_points: ClassVar[tuple[str, ...]] = ("after-claim", "after-spool-ack")
    sample_config: ClassVar[str] = """\
[[sources]]
name = "spool"
type = "directory"
path = {spool}
# Producers write a file elsewhere (or under a dotfile name), then rename it in: a name matching
# the pattern must be a finished file.
pattern = "*.jsonl"
format = "jsonl"                   # one JSON event per line
encoder = "events"
on_done = "delete"                 # or "move": into done/ inside the spool, once published
"""
    sample_try: ClassVar[str] = (
        "echo '{sample}' > {spool_dir}/.first.tmp && "
        "mv {spool_dir}/.first.tmp {spool_dir}/first.jsonl"
    )

    @field_validator("csv_delimiter")
    @classmethod
    def _plain_delimiter(cls, v: str) -> str:
        if not v.isascii() or v in '"\r\n':
            raise ValueError("the delimiter must be one ASCII character, not a quote or a line end")
        return v

    @field_validator("csv_encoding")
    @classmethod
    def _ascii_encoding(cls, v: str) -> str:
        try:
            codecs.lookup(v)
            same = _ASCII.encode(v) == _ASCII.encode()
        except (LookupError, UnicodeError):
            same = False
        if not same:
            raise ValueError(
                f"{v!r} is not an encoding that writes ASCII as ASCII (records are split on "
                "the bytes of quotes, delimiters and line ends)"
            )
        return v

    @field_validator("pattern")
    @classmethod
    def _no_separator(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("pattern matches file names, not paths: use recursive = true")
        return v

    def build(self) -> DirectorySource:
        return DirectorySource(self)

    def directories(self) -> list[DirectoryUse]:
        uses = [DirectoryUse("path", self.path, "input", recursive=self.recursive)]
        if self.on_done == "move":
            done = self.done_dir or self.path / "done"
            uses.append(DirectoryUse("done_dir", done, "output", renamed_from="path"))
        return uses


class DirectorySource(Source):
    """Reads a spool directory: claims files (:class:`.spool_claims.Claims`), reads each from
    its committed offset (:class:`.spool_positions.Positions`) into batches
    (:class:`.spool_formats.FormatReaders`), and finishes it once its end is acknowledged."""

    def __init__(self, config: DirectorySourceConfig) -> None:
        self.config = config
        self.claims = Claims(config)
        """The spool's folders, and the files claimed in them."""
        self.positions = Positions()
        """What of each claim is committed, and which claims were sent to their end."""
        self._formats = FormatReaders(config, Path(self.claims.spool).resolve().name)
        self._counter: Refusals = _Uncounted(config.name)
        """Where refusals outside ``run`` (in ``ack`` and ``recover``) are counted: the
        context, once attached."""

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Committed offset per claimed file (``node/claim``); a file whose end is committed is
        gone (with the bare claim name it had before node folders, if it was migrated)."""
        return spool_positions.fold(state, tokens)

    def attach(self, ctx: SourceContext) -> None:
        self.claims.attach(ctx)
        self._counter = ctx

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        tokens = self._read_tokens(pending)
        await anyio.to_thread.run_sync(self.claims.open)
        for t in tokens:
            if t["eof"]:
                await self._finish(t)
        self.positions.recovered(state, tokens)

    async def aclose(self) -> None:
        self.claims.close()

    async def ack(self, tokens: Sequence[Token]) -> None:
        for t in self._read_tokens(tokens):
            if t["eof"]:
                await self._finish(t)
            self.positions.acked(t)

    async def _finish(self, t: SpoolToken) -> None:
        """Finish the file of an ``eof`` token (:meth:`.Claims.finish`) inside the input's
        boundary: an error finishing one file is counted and logged, and never stops an ack,
        a recovery or the start (a failed fsync excepted)."""
        finish = self.claims.finish
        with InputBoundary(self._counter, f"finishing {t['f']}", "unfinished"):
            rejected, read, part = _rejected(t), t.get("st"), bool(t.get("part"))
            await anyio.to_thread.run_sync(finish, t["f"], rejected, read, t["o"], part)

    def _read_tokens(self, tokens: Sequence[Token]) -> list[SpoolToken]:
        """All the tokens, each version checked, before any is acted on."""
        where = f"source {self.config.name!r} (directory)"
        return [spool_positions.read_token(t, where) for t in tokens]

    async def run(self, ctx: SourceContext) -> None:
        await anyio.to_thread.run_sync(self.claims.open_claims, ctx.node_id)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch)
            await self._read(ctx)

    async def _watch(self) -> None:
        """Check the held folders (:meth:`.Claims.check_held`) every ``WATCH_INTERVAL``
        seconds, while files are read or none come."""
        while True:
            await anyio.sleep(WATCH_INTERVAL)
            await anyio.to_thread.run_sync(self.claims.check_held)

    async def _read(self, ctx: SourceContext) -> None:
        claims = self.claims
        while True:
            found = await anyio.to_thread.run_sync(claims.pending, ctx, self.positions.sent_eof)
            found += await anyio.to_thread.run_sync(claims.claim_new, ctx)
            read = False
            for claim in found:
                read |= await self._read_file(ctx, claim)
            if not read:
                await anyio.sleep(self.config.poll_interval)

    def _reader(self, key: str, rel: str) -> FileReader:
        compression = compression_of(rel, self.config.compression)
        return FileReader(self.claims.claims_fd, key.rpartition("/")[2], compression, self.config)

    async def _read_file(self, ctx: SourceContext, claim: str) -> bool:
        """Read one claim to its end; whether it was read (not refused, not failing)."""
        claims = self.claims
        key = f"{claims.node}/{claim}"
        start = self.positions.start(key)
        rel = printable(original(claim))
        reader = self._reader(key, rel)
        reader.seen = claims.seen.pop(claim, None)
        reader.expect = resume_check(claim)
        try:
            # Shielded, like the close below: an open finishing in its thread after a cancel
            # would leave its file object to the garbage collector.
            with anyio.CancelScope(shield=True):
                await reader.open()
        except FileNotFoundError:
            return False
        except (OSError, Rejected) as e:
            if isinstance(e, OSError) and e.errno not in _UNOPENABLE:
                # Out of descriptors, an I/O error...: may pass, so tried again after a poll.
                if key not in claims.refused:
                    claims.refused.add(key)
                    log.warning("%s: cannot open %s (will retry): %s", ctx.name, rel, e)
                return False
            denied = isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM)
            label = "unreadable" if denied else "not_regular_file"
            reason = f"cannot be read: {e.strerror if isinstance(e, OSError) else e}"
            if start:
                reason += f" (its first {start} bytes were read and published before)"
            await anyio.to_thread.run_sync(
                claims.refuse, ctx, claims.claims_fd, claim, rel, label, reason
            )
            return False
        tracked = _Tracking(ctx, start)
        try:
            with InputBoundary(ctx, f"file {rel}", "read_error") as boundary:
                await self._formats.read(
                    tracked,
                    key,
                    rel,
                    reader,
                    start,
                    lambda: self._reader(key, rel),
                    final=is_final(claim),
                )
            if boundary.error is not None:
                # Whatever was sent before stays sent; the file is set aside whole.
                await reject(ctx, key, rel, boundary.reason, tracked.offset)
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()
            if reader.grew:
                ctx.count_refused("grew_after_publish")
                log.warning(
                    "%s: %s changed after it was published into the spool (producers must "
                    "write elsewhere and rename): read on while it grew",
                    ctx.name,
                    rel,
                )
        self.positions.sent_eof.add(key)
        return True


@dataclass
class _Uncounted:
    """Refusals before a context is attached (a source used without a daemon): logged only."""

    name: str

    def count_refused(self, reason: str, n: int = 1) -> None:
        del reason, n


class _Tracking(SourceContext):
    """A source context that passes everything on to ``ctx`` and remembers the offset of the
    last batch sent: where a file whose reading failed was left."""

    def __init__(self, ctx: SourceContext, offset: int) -> None:
        self._ctx = ctx
        self.offset = offset
        self.name = ctx.name
        self.node_id = ctx.node_id
        self.state_dir = ctx.state_dir
        self.max_batch_events = ctx.max_batch_events
        self.max_batch_bytes = ctx.max_batch_bytes
        self.fs = ctx.fs

    def crash_point(self, point: str) -> None:
        self._ctx.crash_point(point)

    async def send(self, batch: RawBatch) -> None:
        await self._ctx.send(batch)
        self.offset = int(batch.token["o"])

    def count_dropped(self, reason: str, n: int = 1) -> None:
        self._ctx.count_dropped(reason, n)

    def count_refused(self, reason: str, n: int = 1) -> None:
        self._ctx.count_refused(reason, n)


def _rejected(t: SpoolToken) -> str | None:
    """Why a token's file was rejected (it is moved aside when finished), or ``None``."""
    return (t.get("why") or "input rejected") if t.get("bad") else None
