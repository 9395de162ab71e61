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
forget committed positions (``tfrecordd state check`` / ``repair``). No size limit applies to a
record: a commit covering millions of positions is read back whole.

When enough finished intents pile up, their tokens are folded into ``checkpoint.json`` (written
aside, fsynced, renamed in) and the journal restarts with only the unfinished intents, so
recovery time does not grow with uptime. The checkpoint also keeps the type of every source with
state, and the tokens of finished commits of sources no longer configured (folded when the
source is configured again), so a renamed or removed ``[[sources]]`` entry never loses positions.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfrecordd.errors import ConfigError, DurabilityError, StateError, StateFormatError
from tfrecordd.format.framing import HEADER_SIZE, OVERHEAD, frame, header_is_valid, masked_crc32c
from tfrecordd.fsys import FileSystem, read_nofollow, write_atomically

log = logging.getLogger(__name__)

JOURNAL = "journal"
CHECKPOINT = "checkpoint.json"
Fold = Callable[[Any, Sequence[Any]], Any]

_RECORD_START = b'{"t":"'
"""How every intent record's JSON begins (orjson keeps the key order of :meth:`Intent.to_json`)."""
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True)
class Intent:
    """One commit: a shard (or none, for positions alone) and the source tokens it covers."""

    seq: int
    shard: str | None
    positions: dict[str, list[Any]]
    records: int = 0
    size: int = 0
    sha256: str | None = None
    kept: bool = True
    """Journalled by a version that removes a shard's in-progress file only when publishing it
    or after a durable drop, so a missing in-progress file means published. Intents of earlier
    versions lack it: for them only the shard or its manifest proves a publish."""

    def to_json(self) -> dict[str, Any]:
        rec = {
            "t": "intent",
            "seq": self.seq,
            "shard": self.shard,
            "positions": self.positions,
            "records": self.records,
            "size": self.size,
            "sha256": self.sha256,
        }
        if self.kept:
            rec["kept"] = True
        return rec

    @classmethod
    def from_json(cls, rec: Mapping[str, Any]) -> Intent:
        return cls(
            seq=int(rec["seq"]),
            shard=rec["shard"],
            positions=dict(rec["positions"]),
            records=rec.get("records", 0),
            size=rec.get("size", 0),
            sha256=rec.get("sha256"),
            kept=bool(rec.get("kept", False)),
        )


@dataclass(slots=True)
class Recovered:
    """What the journal held at start-up."""

    states: dict[str, Any]
    """Per source: the folded state of every finished commit."""
    unfinished: list[Intent]
    """Intents without ``done``, oldest first: the caller decides which were published."""
    torn_at: int | None = None
    """Byte offset of the first unsound journal record, if the tail was torn."""


@dataclass(slots=True)
class Damage:
    """An unsound journal record followed by sound intents or drops: not a crash, but damage.

    Both are fsynced before anything relies on them, so one found after the unsound record
    proves that record was durable once: a torn tail holds neither."""

    offset: int
    """Where the first unsound record starts."""
    detail: str
    intents_after: int
    """Sound intent records found after it (what cutting there would forget)."""
    drops_after: int = 0
    """Sound drop records found after it (cutting them would turn a dropped commit, whose
    in-progress file is gone, back into an unfinished one)."""


@dataclass(slots=True)
class Scan:
    """A journal file read without changing anything (see :func:`scan_journal`)."""

    records: list[dict[str, Any]]
    """The sound records before the first unsound one, in order."""
    good_end: int
    """Where the sound records end."""
    size: int
    """The file's size."""
    damage: Damage | None = None
    """Set when the unsound part is not a torn tail."""
    salvage: list[dict[str, Any]] = field(default_factory=list)
    """Sound records found after the damage (what ``state repair`` keeps)."""
    newer: int | None = None
    """The format of a record written by a newer tfrecordd, if one was found: nothing after it
    is read, and nothing may be cut or rewritten."""

    @property
    def torn(self) -> bool:
        """Whether a torn tail follows the sound records (cut off at the next start)."""
        if self.newer is not None:
            return False
        return self.damage is None and self.good_end < self.size


@dataclass(slots=True)
class Checkpoint:
    """The checkpoint file's content."""

    next_seq: int = 1
    sources: dict[str, Any] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    unfolded: dict[str, list[Any]] = field(default_factory=dict)
    """Tokens of finished commits of sources not configured when they were folded."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": STATE_FORMAT,
            "next_seq": self.next_seq,
            "sources": self.sources,
        }
        if self.types:
            out["types"] = self.types
        if self.unfolded:
            out["unfolded"] = self.unfolded
        return out


STATE_FORMAT = 1
"""The format of the journal and checkpoint this version writes, and the newest it reads. Every
journal record and the checkpoint carry it; state in a newer format is refused, never misread
(or cut as a torn tail)."""


def newer_format_error(path: str, version: int) -> StateFormatError:
    """The error for state written in a newer format than this version reads."""
    return StateFormatError(
        path,
        f"was written by a newer tfrecordd (state format {version}; this version reads formats "
        f"up to {STATE_FORMAT})",
        "run the tfrecordd version that wrote it, or a newer one; nothing was changed",
    )


def _what_to_do(path: str) -> str:
    return (
        f"{path}: run `tfrecordd state check --config FILE` to see the damage and "
        "`tfrecordd state repair --config FILE` to fix it (see docs/operations.md, "
        '"Damaged state")'
    )


def _read_error(path: str, e: OSError) -> StateError:
    if e.errno == errno.ELOOP:
        return StateError(
            path, "is a symbolic link: tfrecordd never follows one in state_dir", "remove it"
        )
    return StateError(path, f"cannot be read: {e.strerror or e}", _what_to_do(path))


def read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``; ``None`` if there is none. Raises :class:`StateError` if it
    is not a sound checkpoint (never a traceback at start-up)."""
    try:
        data = read_nofollow(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _read_error(path, e) from e
    try:
        raw = orjson.loads(data)
        if not isinstance(raw, dict) or not isinstance(raw.get("sources", {}), dict):
            raise ValueError("not a checkpoint object")
        if (newer := _newer(raw.get("version"))) is not None:
            raise newer_format_error(path, newer)
        ckpt = Checkpoint(
            next_seq=int(raw.get("next_seq", 1)),
            sources=dict(raw.get("sources", {})),
            types={str(k): str(v) for k, v in dict(raw.get("types", {})).items()},
            unfolded={str(k): list(v) for k, v in dict(raw.get("unfolded", {})).items()},
        )
    except (orjson.JSONDecodeError, ValueError, TypeError) as e:
        raise StateError(path, f"is damaged ({len(data)} bytes, {e})", _what_to_do(path)) from e
    return ckpt


def _frames(data: bytes, start: int = 0) -> Iterator[tuple[int, bytes | None, str]]:
    """``(offset, payload, problem)`` for each record from ``start``; the last has ``payload``
    ``None`` when the data ends in an unsound record. No limit on a record's length but the
    data's own."""
    at = start
    end = len(data)
    while at < end:
        header = data[at : at + HEADER_SIZE]
        if len(header) < HEADER_SIZE:
            yield at, None, f"ends {len(header)} bytes into a header"
            return
        if not header_is_valid(header):
            yield at, None, "length CRC mismatch"
            return
        length = int.from_bytes(header[:8], "little")
        body_end = at + HEADER_SIZE + length
        if body_end + 4 > end:
            yield at, None, f"a {length}-byte record runs past the end"
            return
        payload = data[at + HEADER_SIZE : body_end]
        if masked_crc32c(payload) != int.from_bytes(data[body_end : body_end + 4], "little"):
            yield at, None, "data CRC mismatch"
            return
        yield at, payload, ""
        at = body_end + 4


class _NewerFormat(Exception):
    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def _newer(version: Any) -> int | None:
    """``version`` if it is a format newer than :data:`STATE_FORMAT`, else ``None``."""
    return version if isinstance(version, int) and version > STATE_FORMAT else None


def _parse(payload: bytes) -> dict[str, Any]:
    rec = orjson.loads(payload)
    if isinstance(rec, dict) and (newer := _newer(rec.get("v"))) is not None:
        raise _NewerFormat(newer)
    if not isinstance(rec, dict) or rec.get("t") not in ("intent", "done", "sources"):
        raise ValueError("not a journal record")
    if rec["t"] == "intent":
        Intent.from_json(rec)
    elif rec["t"] == "done":
        int(rec["seq"])
    else:
        dict(rec["types"])
    return rec


def _sound_records_after(data: bytes, start: int) -> list[tuple[int, dict[str, Any]]]:
    """Sound records found after a damaged one, resynchronised on whole frames of any record
    type: a drop record between the damage and the next intent must not be lost."""
    found: list[tuple[int, dict[str, Any]]] = []
    at = start + 1
    while at + OVERHEAD <= len(data):
        hit = data.find(_RECORD_START, at + HEADER_SIZE)
        if hit < 0:
            break
        candidate = hit - HEADER_SIZE
        good = 0
        for offset, payload, _ in _frames(data, candidate):
            if payload is None:
                break
            try:
                found.append((offset, _parse(payload)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, _NewerFormat):
                break
            good = offset + OVERHEAD + len(payload)
        at = max(good, candidate + 1)
    return found


def scan_journal(path: str) -> Scan:
    """Read a journal file without changing it; ``Scan.damage`` tells damage from a torn tail."""
    try:
        data = read_nofollow(path)
    except FileNotFoundError:
        return Scan([], 0, 0)
    except OSError as e:
        raise _read_error(path, e) from e
    records: list[dict[str, Any]] = []
    good_end = 0
    problem = ""
    for offset, payload, why in _frames(data):
        if payload is None:
            problem = why
            break
        try:
            records.append(_parse(payload))
        except _NewerFormat as e:
            return Scan(records, offset + OVERHEAD + len(payload), len(data), newer=e.version)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            problem = f"unreadable record ({e})"
            break
        good_end = offset + OVERHEAD + len(payload)
    scan = Scan(records, good_end, len(data))
    if good_end < len(data):
        after = _sound_records_after(data, good_end)
        intents = sum(1 for _, r in after if r["t"] == "intent")
        drops = sum(1 for _, r in after if r["t"] == "done" and r.get("dropped"))
        if intents or drops:
            scan.damage = Damage(good_end, problem, intents, drops)
            scan.salvage = [r for _, r in after]
    return scan


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
        """Read the checkpoint and the journal; cut a torn tail; open for appending.

        Raises:
            StateError: the checkpoint or the journal is damaged (not torn by a crash).
            ConfigError: state belongs to a source that is not configured, in a way that
                would lose or replay it (see :func:`check_sources`).
        """
        os.makedirs(self.state_dir, exist_ok=True)
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
                _what_to_do(self.path),
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
            self._ckpt_identity = self._stat_identity(self.checkpoint_path)
            if any(self._types.get(n) != t for n, t in self.types.items()):
                self._types.update(self.types)
                self._append({"t": "sources", "types": dict(self.types)}, sync=False)
        except OSError as e:
            raise _state_write_error(self.path, e) from e
        return Recovered(states=states, unfinished=unfinished, torn_at=torn_at)

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
        self, shard: str | None, positions: dict[str, list[Any]], **stats: Any
    ) -> Intent:
        """A new intent with the next sequence number (not yet written)."""
        intent = Intent(seq=self._next_seq, shard=shard, positions=positions, **stats)
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
        ckpt = Checkpoint(self._next_seq, self._states, types, self._unfolded)
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
            log.warning("journal: source %r is no longer configured; keeping its state", old)
    if errors:
        raise ConfigError([*errors, f"(state read from {os.path.dirname(journal_path)})"])
