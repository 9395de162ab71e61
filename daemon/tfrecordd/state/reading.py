"""Reading the state files back, changing nothing: :func:`read_checkpoint` and
:func:`scan_journal`, which tells a torn tail (a crash mid-write: cut off) from damage (stop)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfrecordd.errors import StateError
from tfrecordd.format.framing import HEADER_SIZE, OVERHEAD, header_is_valid, masked_crc32c
from tfrecordd.fsys import read_nofollow
from tfrecordd.state.records import (
    STATE_FORMAT,
    Checkpoint,
    Intent,
    OpenRef,
    damage_advice,
    last_commit_of,
    newer_format_error,
)

__all__ = ["Damage", "Scan", "read_checkpoint", "scan_journal"]

_RECORD_START = b'{"t":"'
"""How every intent record's JSON begins (orjson keeps the key order of :meth:`Intent.to_json`)."""


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


def _read_error(path: str, e: OSError) -> StateError:
    if e.errno == errno.ELOOP:
        return StateError(
            path, "is a symbolic link: tfrecordd never follows one in state_dir", "remove it"
        )
    return StateError(path, f"cannot be read: {e.strerror or e}", damage_advice(path))


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
            open=[OpenRef.from_json(o) for o in raw.get("open", ())],
            last_commit=last_commit_of(raw.get("last_commit")),
        )
    except (orjson.JSONDecodeError, ValueError, TypeError) as e:
        raise StateError(path, f"is damaged ({len(data)} bytes, {e})", damage_advice(path)) from e
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
