"""What the state files hold: intents, the checkpoint, and the format version of both.

The journal (:data:`JOURNAL`) is a sequence of TFRecord-framed JSON records: ``intent``
(:class:`Intent`), ``done`` (with ``dropped`` for a drop) and ``sources`` (the types of the
configured sources); the checkpoint (:data:`CHECKPOINT`) is one JSON object
(:class:`Checkpoint`). Every record and the checkpoint carry :data:`STATE_FORMAT`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrecordd.errors import StateFormatError

__all__ = [
    "CHECKPOINT",
    "JOURNAL",
    "STATE_FORMAT",
    "Checkpoint",
    "Intent",
    "OpenRef",
    "ShardRef",
    "damage_advice",
    "last_commit_of",
    "newer_format_error",
]

JOURNAL = "journal"
CHECKPOINT = "checkpoint.json"
STATE_FORMAT = 2
"""The format of the journal and checkpoint this version writes, and the newest it reads. Every
journal record and the checkpoint carry it; state in a newer format is refused, never misread
(or cut as a torn tail)."""


@dataclass(frozen=True, slots=True)
class ShardRef:
    """A shard an intent publishes."""

    dataset: str
    """Its dataset; ``""`` in intents of versions before datasets (the config's one dataset)."""
    name: str
    """Where it is published, relative to its dataset's output: ``[<partition>/]<file name>``."""
    records: int = 0
    size: int = 0
    sha256: str | None = None

    def to_json(self) -> list[Any]:
        return [self.dataset, self.name, self.records, self.size, self.sha256]

    @classmethod
    def from_json(cls, rec: Sequence[Any]) -> ShardRef:
        dataset, name, records, size, sha256 = rec
        return cls(str(dataset), str(name), int(records), int(size), sha256)


@dataclass(frozen=True, slots=True)
class OpenRef:
    """A shard a commit leaves open, and the prefix of it the commit made durable: after a
    crash, the shard is finished there and published (its records' positions are committed)."""

    dataset: str
    name: str
    size: int
    """Bytes of the file that are durable, ending a compression unit."""
    records: int
    adler32: int
    """Adler-32 of the raw record stream up to there (for a zlib shard's trailer)."""

    @property
    def key(self) -> tuple[str, str]:
        """``(dataset, name)``: what identifies the shard."""
        return (self.dataset, self.name)

    def to_json(self) -> list[Any]:
        return [self.dataset, self.name, self.size, self.records, self.adler32]

    @classmethod
    def from_json(cls, rec: Sequence[Any]) -> OpenRef:
        dataset, name, size, records, adler32 = rec
        return cls(str(dataset), str(name), int(size), int(records), int(adler32))


@dataclass(slots=True)
class Intent:
    """One commit: the source tokens it covers, the shards it publishes (none, for positions
    alone) and the prefixes of the shards it leaves open."""

    seq: int
    positions: dict[str, list[Any]]
    shards: list[ShardRef] = field(default_factory=list)
    open: list[OpenRef] = field(default_factory=list)
    kept: bool = True
    """Journalled by a version that removes a shard's in-progress file only when publishing it
    or after a durable drop, so a missing in-progress file means published. Intents of earlier
    versions lack it: for them only the shard or its manifest proves a publish."""
    dead_letters: list[int] | None = None
    """Where the dead-letter file ended at the commit's cut, ``[device, inode, size]``, ``[]``
    if there was none (:meth:`~tfrecordd.state.deadletter.DeadLetters.end`); ``None``: not
    known (an earlier version)."""

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"t": "intent", "seq": self.seq, "positions": self.positions}
        if self.shards:
            rec["shards"] = [s.to_json() for s in self.shards]
        if self.open:
            rec["open"] = [o.to_json() for o in self.open]
        if self.kept:
            rec["kept"] = True
        if self.dead_letters is not None:
            rec["dead_letters"] = self.dead_letters
        return rec

    @classmethod
    def from_json(cls, rec: Mapping[str, Any]) -> Intent:
        shards = [ShardRef.from_json(s) for s in rec.get("shards", ())]
        if rec.get("shard") is not None:
            # Format 1: one shard, of the config's one dataset.
            shards.append(
                ShardRef(
                    "", rec["shard"], rec.get("records", 0), rec.get("size", 0), rec.get("sha256")
                )
            )
        return cls(
            seq=int(rec["seq"]),
            positions=dict(rec["positions"]),
            shards=shards,
            open=[OpenRef.from_json(o) for o in rec.get("open", ())],
            kept=bool(rec.get("kept", False)),
            dead_letters=_end(rec.get("dead_letters")),
        )


@dataclass(slots=True)
class Checkpoint:
    """The checkpoint file's content."""

    next_seq: int = 1
    sources: dict[str, Any] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    unfolded: dict[str, list[Any]] = field(default_factory=dict)
    """Tokens of finished commits of sources not configured when they were folded."""
    open: list[OpenRef] = field(default_factory=list)
    """Shards left open by finished commits and not published since, with their durable
    prefixes (finished and published by the next start after a crash)."""
    last_commit: tuple[int, list[int] | None] | None = None
    """The latest finished commit folded in: its sequence number and its intent's
    ``dead_letters``."""

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
        if self.open:
            out["open"] = [o.to_json() for o in self.open]
        if self.last_commit is not None:
            out["last_commit"] = {"seq": self.last_commit[0], "dead_letters": self.last_commit[1]}
        return out


def _end(value: Any) -> list[int] | None:
    """An intent's ``dead_letters`` as read: three integers or none, else ``None`` (nothing
    is cut)."""
    if isinstance(value, list) and len(value) in (0, 3) and all(type(v) is int for v in value):
        return value
    return None


def last_commit_of(value: Any) -> tuple[int, list[int] | None] | None:
    """A checkpoint's ``last_commit`` as read (``None``: none, or not understood)."""
    if isinstance(value, dict) and type(value.get("seq")) is int:
        return value["seq"], _end(value.get("dead_letters"))
    return None


def newer_format_error(path: str, version: int) -> StateFormatError:
    """The error for state written in a newer format than this version reads."""
    return StateFormatError(
        path,
        f"was written by a newer tfrecordd (state format {version}; this version reads formats "
        f"up to {STATE_FORMAT})",
        "run the tfrecordd version that wrote it, or a newer one; nothing was changed",
    )


def damage_advice(path: str) -> str:
    """What an operator runs about damaged state at ``path``."""
    return (
        f"{path}: run `tfrecordd state check --config FILE` to see the damage and "
        "`tfrecordd state repair --config FILE` to fix it (see docs/operations.md, "
        '"Damaged state")'
    )
