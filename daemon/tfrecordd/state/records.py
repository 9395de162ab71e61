"""What the state files hold: intents, the checkpoint, and the format version of both.

The journal (:data:`JOURNAL`) is a sequence of TFRecord-framed JSON records: ``intent``
(:class:`Intent`), ``done`` (with ``dropped`` for a drop) and ``sources`` (the types of the
configured sources); the checkpoint (:data:`CHECKPOINT`) is one JSON object
(:class:`Checkpoint`). Every record and the checkpoint carry :data:`STATE_FORMAT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfrecordd.errors import StateFormatError

__all__ = [
    "CHECKPOINT",
    "JOURNAL",
    "STATE_FORMAT",
    "Checkpoint",
    "Intent",
    "damage_advice",
    "newer_format_error",
]

JOURNAL = "journal"
CHECKPOINT = "checkpoint.json"
STATE_FORMAT = 1
"""The format of the journal and checkpoint this version writes, and the newest it reads. Every
journal record and the checkpoint carry it; state in a newer format is refused, never misread
(or cut as a torn tail)."""


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
