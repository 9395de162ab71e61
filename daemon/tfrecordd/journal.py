"""The commit journal: CRC-framed, fsynced intent records, folded into a checkpoint.

Each record is a TFRecord-framed JSON object. An ``intent`` is appended and fsynced before a
shard is published; it names the shard and the source tokens it covers. A ``done`` follows once
the sources have acknowledged them. Recovery reads the checkpoint, then the journal up to its
first unsound record (only the tail can be torn by a crash), and sorts each intent into:

* finished: ``done`` was written; its tokens are folded into the sources' committed state;
* to redo: the shard was published (or the commit had no shard) but ``done`` is missing: acks
  are redone, idempotently;
* dropped: the shard never reached its final name; its events replay from the sources.

When enough finished intents pile up, their tokens are folded into ``checkpoint.json`` (written
aside, fsynced, renamed in) and the journal restarts with only the unfinished intents, so
recovery time does not grow with uptime.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfrecordd.errors import RecordError
from tfrecordd.framing import frame, iter_framed
from tfrecordd.fsys import FileSystem, write_atomically

log = logging.getLogger(__name__)

JOURNAL = "journal"
CHECKPOINT = "checkpoint.json"
Fold = Callable[[Any, Sequence[Any]], Any]


@dataclass(slots=True)
class Intent:
    """One commit: a shard (or none, for positions alone) and the source tokens it covers."""

    seq: int
    shard: str | None
    positions: dict[str, list[Any]]
    records: int = 0
    size: int = 0
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "t": "intent",
            "seq": self.seq,
            "shard": self.shard,
            "positions": self.positions,
            "records": self.records,
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(slots=True)
class Recovered:
    """What the journal held at start-up."""

    states: dict[str, Any]
    """Per source: the folded state of every finished commit."""
    unfinished: list[Intent]
    """Intents without ``done``, oldest first: the caller decides which were published."""
    torn_at: int | None = None
    """Byte offset of the first unsound journal record, if the tail was torn."""


@dataclass
class Journal:
    """The append-only commit journal of one daemon, in ``state_dir``."""

    state_dir: str
    fs: FileSystem
    folds: Mapping[str, Fold]
    fsync: bool = True
    compact_after: int = 512
    _file: Any = None
    _next_seq: int = 1
    _states: dict[str, Any] = field(default_factory=dict)
    """Per source: the checkpoint's state with every finished intent since folded in."""
    _finished_count: int = 0
    _unfolded: set[str] = field(default_factory=set)
    _open: dict[int, Intent] = field(default_factory=dict)
    size: int = 0

    @property
    def path(self) -> str:
        return os.path.join(self.state_dir, JOURNAL)

    def recover(self) -> Recovered:
        """Read the checkpoint and the journal; truncate a torn tail; open for appending."""
        os.makedirs(self.state_dir, exist_ok=True)
        ckpt_path = os.path.join(self.state_dir, CHECKPOINT)
        if os.path.exists(ckpt_path):
            with open(ckpt_path, "rb") as f:
                ckpt = orjson.loads(f.read())
            self._states = dict(ckpt.get("sources", {}))
            self._next_seq = int(ckpt.get("next_seq", 1))
        intents: dict[int, Intent] = {}
        done: set[int] = set()
        dropped: set[int] = set()
        torn_at: int | None = None
        good_end = 0
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                data = f.read()
            try:
                for offset, payload in iter_framed(io.BytesIO(data), self.path):
                    rec = orjson.loads(payload)
                    good_end = offset + 16 + len(payload)
                    seq = int(rec["seq"])
                    self._next_seq = max(self._next_seq, seq + 1)
                    if rec["t"] == "intent":
                        intents[seq] = Intent(
                            seq=seq,
                            shard=rec["shard"],
                            positions=rec["positions"],
                            records=rec.get("records", 0),
                            size=rec.get("size", 0),
                            sha256=rec.get("sha256"),
                        )
                    elif rec["t"] == "done":
                        (dropped if rec.get("dropped") else done).add(seq)
            except (RecordError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                torn_at = good_end
                log.warning("journal: stopping at the first unsound record (%s)", e)
            if good_end < len(data):
                torn_at = good_end if torn_at is None else torn_at
                with open(self.path, "r+b") as f:
                    f.truncate(good_end)
                    self.fs.fsync(f)
        for seq in sorted(intents):
            if seq in done:
                self._add_finished(intents[seq])
        states = dict(self._states)
        unfinished = [intents[s] for s in sorted(intents) if s not in done and s not in dropped]
        self._open = {i.seq: i for i in unfinished}
        self._reopen()
        return Recovered(states=states, unfinished=unfinished, torn_at=torn_at)

    def _add_finished(self, intent: Intent) -> None:
        # Folded at once, not kept until the next compaction: a shard of a million records can
        # cover a thousand tokens, and hundreds of commits go by between two compactions.
        for source, tokens in intent.positions.items():
            fold = self.folds.get(source)
            if fold is None:
                if source not in self._unfolded:
                    self._unfolded.add(source)
                    log.warning(
                        "journal: source %r is no longer configured; keeping its state", source
                    )
                continue
            self._states[source] = fold(self._states.get(source), tokens)
        self._finished_count += 1

    def _append(self, record: dict[str, Any], *, sync: bool) -> None:
        data = frame(orjson.dumps(record))
        self.fs.write(self._file, data)
        self.size += len(data)
        if sync and self.fsync:
            self.fs.fsync(self._file)
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

    def drop(self, seq: int) -> None:
        """Forget an unfinished intent whose shard was never published (its tokens are not
        committed: the events replay from their sources)."""
        self._append({"t": "done", "seq": seq, "dropped": True}, sync=False)
        self._open.pop(seq, None)

    def compact(self) -> None:
        """Fold finished intents into the checkpoint and restart the journal."""
        ckpt = {"version": 1, "next_seq": self._next_seq, "sources": self._states}
        write_atomically(self.fs, os.path.join(self.state_dir, CHECKPOINT), orjson.dumps(ckpt))
        fresh = b"".join(frame(orjson.dumps(i.to_json())) for i in self._open.values())
        write_atomically(self.fs, self.path, fresh)
        self._file.close()
        self._reopen()
        self._finished_count = 0

    def _reopen(self) -> None:
        self._file, created = self.fs.open_append(self.path)
        if created and self.fsync:
            self.fs.fsync_dir(self.state_dir)
        self.size = os.fstat(self._file.fileno()).st_size

    def close(self) -> None:
        """Flush and close the journal file."""
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None
