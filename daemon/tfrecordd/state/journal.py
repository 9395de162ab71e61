"""The commit journal: CRC-framed, fsynced intent records, folded into a checkpoint.

Each record is a TFRecord-framed JSON object. An ``intent`` is appended and fsynced before a
shard is published; it names the shard and the source tokens it covers. A ``done`` follows once
the sources have acknowledged them. Recovery reads the checkpoint, then the journal, and sorts
each intent into:

* finished: ``done`` was written; its tokens are folded into the sources' committed state;
* to redo: the shard was published (or the commit had no shard) but ``done`` is missing: acks
  are redone, idempotently;
* dropped: the shard never reached its final name; its events replay from the sources.

Only what was written after the last fsync can be torn by a crash, and every intent is fsynced
with everything before it: an unsound record is a torn tail, cut off, only when no sound intent
follows it. Anything else is damage, and recovery stops with :class:`StateError` rather than
forget committed positions (``tfrecordd state check`` / ``repair``). What recovery read is made
durable (the journal and its folder fsynced) before anything is redone from it: a process killed
between a write and its fsync leaves records readable that a power cut would still take. No size
limit applies to a record: a commit covering millions of positions is read back whole.

When enough finished intents pile up, their tokens are folded into ``checkpoint.json`` (written
aside, fsynced, renamed in) and the journal restarts with only the unfinished intents, so
recovery time does not grow with uptime. The checkpoint also keeps the type of every source with
state, and the tokens of finished commits of sources no longer configured (folded when the
source is configured again), so a renamed or removed ``[[sources]]`` entry never loses positions.

A ``tfrecordd state`` command interrupted after committing its change
(:mod:`tfrecordd.state.change`) is finished before anything is read.

While the daemon runs, each commit checks that the journal and the checkpoint are still the
files it holds: one removed or replaced under it (``state_dir`` deleted, a backup restored)
stops the daemon with :class:`~tfrecordd.errors.DurabilityError` (exit 74).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfrecordd.errors import ConfigError, DurabilityError, StateError
from tfrecordd.format.framing import frame
from tfrecordd.fsys import FileSystem, write_atomically
from tfrecordd.state import change
from tfrecordd.state.reading import read_checkpoint, scan_journal
from tfrecordd.state.records import (
    CHECKPOINT,
    JOURNAL,
    STATE_FORMAT,
    Checkpoint,
    Intent,
    OpenRef,
    ShardRef,
    damage_advice,
    newer_format_error,
)

__all__ = ["Fold", "Journal", "Recovered", "check_sources"]

log = logging.getLogger(__name__)

Fold = Callable[[Any, Sequence[Any]], Any]
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True)
class Recovered:
    """What the journal held at start-up."""

    states: dict[str, Any]
    """Per source: the folded state of every finished commit."""
    unfinished: list[Intent]
    """Intents without ``done``, oldest first: the caller decides which were published."""
    open: list[OpenRef] = field(default_factory=list)
    """Shards finished commits left open (their durable prefixes), not published since."""
    torn_at: int | None = None
    """Byte offset of the first unsound journal record, if the tail was torn."""
    last_commit: tuple[int, list[int] | None] | None = None
    """The latest finished commit: its sequence number and where the dead letters ended at its
    cut (:attr:`Intent.dead_letters`)."""


@dataclass(frozen=True, slots=True)
class _Identity:
    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Identity:
        return cls(st.st_dev, st.st_ino)


@dataclass
class Journal:
    """The append-only commit journal of one daemon, in ``state_dir``."""

    state_dir: str
    fs: FileSystem
    folds: Mapping[str, Fold]
    fsync: bool = True
    compact_after: int = 512
    types: Mapping[str, str] = field(default_factory=dict)
    """Type of each configured source (kept in the checkpoint, to tell a rename)."""
    _file: Any = None
    _next_seq: int = 1
    _states: dict[str, Any] = field(default_factory=dict)
    """Per source: the checkpoint's state with every finished intent since folded in."""
    _types: dict[str, str] = field(default_factory=dict)
    _unfolded: dict[str, list[Any]] = field(default_factory=dict)
    _finished_count: int = 0
    _open: dict[int, Intent] = field(default_factory=dict)
    _open_shards: dict[tuple[str, str], OpenRef] = field(default_factory=dict)
    """Shards left open by finished intents (their latest durable prefixes), not published
    since: kept in the checkpoint."""
    _last_commit: tuple[int, list[int] | None] | None = None
    """The latest finished intent's sequence number and ``dead_letters``: kept in the
    checkpoint."""
    _identity: _Identity | None = None
    _failed: bool = False
    _ckpt_identity: _Identity | None = None
    _files_lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while the files are replaced and their identities updated (compaction), so that
    :meth:`check_files`, called from another thread, never sees one without the other."""
    size: int = 0

    @property
    def path(self) -> str:
        return os.path.join(self.state_dir, JOURNAL)

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.state_dir, CHECKPOINT)

    @property
    def is_open(self) -> bool:
        """Whether the journal file is open (from :meth:`recover` until :meth:`close`)."""
        return self._file is not None

    def recover(self) -> Recovered:
        """Finish an interrupted ``state`` command's change; read the checkpoint and the
        journal; cut a torn tail; open for appending.

        Raises:
            StateError: the checkpoint or the journal is damaged (not torn by a crash).
            ConfigError: state belongs to a source that is not configured, in a way that
                would lose or replay it (see :func:`check_sources`).
        """
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            interrupted = change.finish(self.state_dir)
        except OSError as e:
            raise _state_write_error(os.path.join(self.state_dir, change.MARKER), e) from e
        if interrupted is not None:
            log.warning("state: finished the interrupted `%s`", interrupted.text)
        ckpt = read_checkpoint(self.checkpoint_path) or Checkpoint()
        self._next_seq = ckpt.next_seq
        self._types = dict(ckpt.types)
        scan = scan_journal(self.path)
        if scan.newer is not None:
            raise newer_format_error(self.path, scan.newer)
        if scan.damage is not None:
            d = scan.damage
            raise StateError(
                self.path,
                f"is damaged at byte {d.offset} ({d.detail}), and durable records follow "
                f"({d.intents_after} committed intent(s), {d.drops_after} drop(s)): this is not "
                "a torn tail, and cutting it would forget committed positions",
                damage_advice(self.path),
            )
        intents: dict[int, Intent] = {}
        done: set[int] = set()
        dropped: set[int] = set()
        for rec in scan.records:
            if rec["t"] == "sources":
                self._types.update(rec["types"])
                continue
            seq = int(rec["seq"])
            self._next_seq = max(self._next_seq, seq + 1)
            if rec["t"] == "intent":
                intents[seq] = Intent.from_json(rec)
            elif rec.get("dropped"):
                dropped.add(seq)
            else:
                done.add(seq)
        unfinished = [intents[s] for s in sorted(intents) if s not in done and s not in dropped]
        finished = [intents[s] for s in sorted(intents) if s in done]
        check_sources(self.path, self.types, ckpt, finished, unfinished, self._types)
        torn_at: int | None = None
        if scan.torn:
            torn_at = scan.good_end
            log.warning(
                "journal: torn tail of %d byte(s) at byte %d cut off (a crash during a write)",
                scan.size - scan.good_end,
                scan.good_end,
            )
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, scan.good_end)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self._states = dict(ckpt.sources)
        self._open_shards = {o.key: o for o in ckpt.open}
        self._last_commit = ckpt.last_commit
        self._unfolded = {k: list(v) for k, v in ckpt.unfolded.items()}
        for name in [n for n in self._unfolded if n in self.folds]:
            # Configured again (renamed back, or restored): its kept tokens are folded now.
            self._states[name] = self.folds[name](self._states.get(name), self._unfolded.pop(name))
        for intent in finished:
            self._add_finished(intent)
        states = dict(self._states)
        self._open = {i.seq: i for i in unfinished}
        try:
            self._reopen()
            if self.fsync:
                # What recovery acts on must be durable first: a process killed after writing a
                # record (or renaming a checkpoint in) and before its fsync left it readable and
                # not durable. Redone from here without this, a later power cut would take the
                # record and leave its effects (a shard published, spool files acknowledged).
                self.fs.fsync(self._file)
                self.fs.fsync_dir(self.state_dir)
            self._ckpt_identity = self._stat_identity(self.checkpoint_path)
            if any(self._types.get(n) != t for n, t in self.types.items()):
                self._types.update(self.types)
                self._append({"t": "sources", "types": dict(self.types)}, sync=False)
        except OSError as e:
            raise _state_write_error(self.path, e) from e
        return Recovered(
            states=states,
            unfinished=unfinished,
            torn_at=torn_at,
            open=list(self._open_shards.values()),
            last_commit=self._last_commit,
        )

    def _add_finished(self, intent: Intent) -> None:
        # Folded at once, not kept until the next compaction: a shard of a million records can
        # cover a thousand tokens, and hundreds of commits go by between two compactions.
        for source, tokens in intent.positions.items():
            fold = self.folds.get(source)
            if fold is None:
                # Not configured: its tokens are kept as they are, for when it is again.
                self._unfolded.setdefault(source, []).extend(tokens)
                continue
            self._states[source] = fold(self._states.get(source), tokens)
        for shard in intent.shards:
            self._open_shards.pop((shard.dataset, shard.name), None)
        for prefix in intent.open:
            self._open_shards[prefix.key] = prefix
        if self._last_commit is None or intent.seq > self._last_commit[0]:
            self._last_commit = intent.seq, intent.dead_letters
        self._finished_count += 1

    def _stat_identity(self, path: str) -> _Identity | None:
        try:
            return _Identity.of(os.lstat(path))
        except FileNotFoundError:
            return None

    def check_files(self) -> None:
        """Raise :class:`DurabilityError` if the journal or the checkpoint was removed or
        replaced since this daemon last wrote it (``state_dir`` deleted, a copy put back)."""
        with self._files_lock:
            identities = (
                (self.path, self._identity, self._stat_identity(self.path)),
                (
                    self.checkpoint_path,
                    self._ckpt_identity,
                    self._stat_identity(self.checkpoint_path),
                ),
            )
        for path, held, now in identities:
            if now != held:
                what = "removed" if now is None else "replaced"
                raise DurabilityError(
                    f"{path} was {what} while the daemon ran: committed positions would be "
                    "lost at the next start; stopping. Put state_dir back as it was, or run "
                    "`tfrecordd state check --config FILE` before starting again"
                )

    def _append(self, record: dict[str, Any], *, sync: bool) -> None:
        if self._failed:
            raise DurabilityError(f"{self.path}: failed earlier; not written again")
        data = frame(orjson.dumps({**record, "v": STATE_FORMAT}))
        try:
            self.fs.write(self._file, data)
        except OSError as e:
            # A short append must not stay in the middle of the journal, where later records
            # would make it look like damage rather than a torn tail.
            with contextlib.suppress(OSError):
                os.ftruncate(self._file.fileno(), self.size)
            raise _state_write_error(self.path, e) from e
        self.size += len(data)
        if sync and self.fsync:
            try:
                self.fs.fsync(self._file)
            except OSError:
                # Never fsynced again: what it held may be gone (see FileSystem.fsync).
                self._failed = True
                raise
        else:
            self._file.flush()

    def next_intent(
        self,
        positions: dict[str, list[Any]],
        shards: Sequence[ShardRef] = (),
        open_shards: Sequence[OpenRef] = (),
        dead_letters: list[int] | None = None,
    ) -> Intent:
        """A new intent with the next sequence number (not yet written)."""
        intent = Intent(
            self._next_seq, positions, list(shards), list(open_shards), dead_letters=dead_letters
        )
        self._next_seq += 1
        return intent

    def write_intent(self, intent: Intent) -> None:
        """Append and fsync an intent: after this returns, the commit survives a crash."""
        self.check_files()
        self._append(intent.to_json(), sync=True)
        self._open[intent.seq] = intent

    def write_done(self, seq: int) -> None:
        """Record that the intent's acks are done (no fsync: redoing acks is harmless)."""
        self._append({"t": "done", "seq": seq}, sync=False)
        intent = self._open.pop(seq, None)
        if intent is not None:
            self._add_finished(intent)
        if self._finished_count >= self.compact_after:
            self.compact()

    def drop(self, seq: int, *, sync: bool = True) -> None:
        """Forget an unfinished intent whose shard was never published (its tokens are not
        committed: the events replay from their sources). Durable when this returns (unless
        ``sync`` is false: then before the next fsync of the journal): only then may the
        shard's in-progress file go, since recovery takes an intent whose in-progress file
        and shard are both gone for published (and its shard moved away)."""
        self._append({"t": "done", "seq": seq, "dropped": True}, sync=sync)
        self._open.pop(seq, None)

    def sync(self) -> None:
        """Fsync the journal (after :meth:`drop` calls with ``sync=False``)."""
        if self.fsync and self._file is not None:
            try:
                self.fs.fsync(self._file)
            except OSError as e:
                self._failed = True
                raise _state_write_error(self.path, e) from e

    def compact(self) -> None:
        """Fold finished intents into the checkpoint and restart the journal."""
        with self._files_lock:
            self._compact()

    def _compact(self) -> None:
        self.check_files()
        types = {n: t for n, t in self._types.items() if n in self._states or n in self._unfolded}
        types.update(self.types)
        ckpt = Checkpoint(
            self._next_seq,
            self._states,
            types,
            self._unfolded,
            list(self._open_shards.values()),
            self._last_commit,
        )
        fresh = b"".join(frame(orjson.dumps(i.to_json())) for i in self._open.values())
        try:
            write_atomically(self.fs, self.checkpoint_path, orjson.dumps(ckpt.to_json()))
            self._ckpt_identity = self._stat_identity(self.checkpoint_path)
            write_atomically(self.fs, self.path, fresh)
            self._file.close()
            self._reopen()
        except OSError as e:
            raise _state_write_error(self.state_dir, e) from e
        self._types = types
        self._finished_count = 0

    def _reopen(self) -> None:
        self._file, created = self.fs.open_append(self.path)
        if created and self.fsync:
            self.fs.fsync_dir(self.state_dir)
        st = os.fstat(self._file.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", self.path)
        self._identity = _Identity.of(st)
        self.size = st.st_size

    def close(self) -> None:
        """Flush and close the journal file."""
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None


def _state_write_error(path: str, e: OSError) -> DurabilityError:
    if e.errno in _SPACE_ERRNOS:
        return DurabilityError(
            f"{path}: no space left for the daemon's state (state_dir is full); nothing more "
            "is acknowledged. Free space on its file system and start again: unacknowledged "
            "events replay"
        )
    if e.errno == errno.ELOOP:
        return DurabilityError(
            f"{path}: is a symbolic link; tfrecordd never follows one in state_dir. Remove it"
        )
    return DurabilityError(f"{path}: {e.strerror or e}")


def check_sources(
    journal_path: str,
    configured: Mapping[str, str],
    ckpt: Checkpoint,
    finished: Sequence[Intent],
    unfinished: Sequence[Intent],
    types: Mapping[str, str],
) -> None:
    """Refuse state that the configured sources would lose or replay.

    A source with committed positions that is no longer configured keeps them (in the
    checkpoint) as long as nothing suggests it was renamed. It was, when a configured source of
    the same type (or of a type not recorded) has no state at all: the renamed source would
    read its input again from the start. And a commit of a source no longer configured whose
    acks are not done cannot be finished. Either way :class:`ConfigError` (exit 78) names both
    and says what to do. ``configured`` is empty for callers that check nothing.
    """
    if not configured:
        return
    seen: set[str] = set(ckpt.sources) | set(ckpt.types) | set(ckpt.unfolded) | set(types)
    holding: set[str] = {n for n, s in ckpt.sources.items() if s} | set(ckpt.unfolded)
    for intent in [*finished, *unfinished]:
        seen.update(intent.positions)
        holding.update(n for n, t in intent.positions.items() if t)
    pending = {n for i in unfinished for n, t in i.positions.items() if t}
    fresh = [n for n in configured if n not in seen]
    errors: list[str] = []
    for old in sorted(n for n in holding if n not in configured):
        old_type = types.get(old) or ckpt.types.get(old)
        same = [n for n in fresh if old_type is None or configured[n] == old_type]
        if same:
            errors.append(
                f"sources: state_dir holds committed positions of source {old!r} "
                f"(type {old_type or 'not recorded'}), which is not configured, and source "
                f"{same[0]!r} has none: if {same[0]!r} is {old!r} renamed, run `tfrecordd state "
                f"rename-source --config FILE {old} {same[0]}` (or restore the name), so it "
                "resumes where it stopped instead of reading its input again from the start; "
                f"if {old!r} was removed on purpose, run `tfrecordd state forget-source "
                f"--config FILE {old}`"
            )
        elif old in pending:
            errors.append(
                f"sources: a commit of source {old!r}, which is not configured, is published "
                "but not acknowledged: restore its [[sources]] entry (or rename it with "
                "`tfrecordd state rename-source`) so its acknowledgements are redone"
            )
        else:
            log.warning(
                "journal: source %r is no longer configured; keeping its state (if it was "
                "removed for good: `tfrecordd state forget-source %s --config FILE` with the "
                "daemon stopped)",
                old,
                old,
            )
    if errors:
        raise ConfigError([*errors, f"(state read from {os.path.dirname(journal_path)})"])
