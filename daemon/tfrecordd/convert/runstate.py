"""What a conversion keeps beside its output, in ``<output>/.tfrecordd-convert/`` (a hidden
folder: no shard glob reaches it): the state file, its lock and the dead letters.

``state.json`` is replaced atomically (written, fsynced, renamed, its folder fsynced) after each
shard is published. It names the arguments the conversion runs with, the shards published and
where the input goes on after the last of them (a unit and a batch in it), and how long the
dead-letter file was then. A run killed at any moment and started again continues from there:
what it wrote after the last state (an unpublished shard, dead letters) is cut away and made
again, byte for byte the same. ``dead-letters.jsonl`` holds the dead letters, one JSON object a
line, as the daemon writes them (``source`` is ``"convert"``).
"""

from __future__ import annotations

import base64
import fcntl
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import orjson

from tfrecordd.convert.encodeunits import DeadLetter
from tfrecordd.errors import DurabilityError, StateError, StateInUseError
from tfrecordd.fsys import FileSystem, write_atomically

FOLDER = ".tfrecordd-convert"
STATE = "state.json"
DEAD_LETTERS = "dead-letters.jsonl"
VERSION = 1


@dataclass(slots=True)
class RunState:
    """A conversion's progress, as its state file holds it."""

    args: dict[str, Any]
    """What the output depends on: a run with other arguments is refused."""
    shards: list[dict[str, Any]] = field(default_factory=list)
    """Each published shard: ``name``, ``records``, ``size``, ``sha256``."""
    next_unit: int = 0
    next_batch: int = 0
    dead_letter_bytes: int = 0
    dead_letters: int = 0
    records: int = 0
    events: int = 0
    input_bytes: int = 0
    done: bool = False
    inputs: list[list[Any]] = field(default_factory=list)
    """Each input as listed: ``[path, size, mtime_ns, format]`` (what a refusal to resume with
    other inputs names)."""

    def to_json(self) -> bytes:
        return orjson.dumps({"version": VERSION} | asdict(self), option=orjson.OPT_INDENT_2)


def load(path: str) -> RunState | None:
    """The state at ``path``; ``None`` if there is none.

    Raises:
        StateError: the file is not a state this version wrote.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        doc = orjson.loads(raw)
        if doc.pop("version") != VERSION:
            raise ValueError("another version")
        return RunState(**doc)
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise StateError(path, f"is not a conversion state this version reads ({e})") from None


def save(fs: FileSystem, path: str, state: RunState) -> None:
    """Replace the state file atomically and durably."""
    try:
        write_atomically(fs, path, state.to_json())
    except OSError as e:
        raise DurabilityError(f"{path}: {e.strerror or e}") from e


def differences(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The arguments in which two runs differ, as ``name: was → now``."""
    keys = sorted(set(saved) | set(wanted))
    return [
        f"{k}: {saved.get(k)!r} → {wanted.get(k)!r}" for k in keys if saved.get(k) != wanted.get(k)
    ]


def input_changes(saved: list[list[Any]], now: list[list[Any]], most: int = 5) -> list[str]:
    """How the inputs listed ``now`` differ from those ``saved``, a file each (``most`` at
    most, then how many more): added, gone, another size or format, or modified (only the
    modification time differs: a conversion cannot tell a ``touch`` from new content of the
    same size, and refuses both)."""
    before = {str(f[0]): f[1:] for f in saved}
    after = {str(f[0]): f[1:] for f in now}
    out: list[str] = []
    for path in sorted(before.keys() | after.keys()):
        was, is_ = before.get(path), after.get(path)
        if was == is_:
            continue
        if was is None:
            out.append(f"{path}: new")
        elif is_ is None:
            out.append(f"{path}: gone")
        elif was[0] != is_[0]:
            out.append(f"{path}: {was[0]} bytes → {is_[0]}")
        elif was[2] != is_[2]:
            out.append(f"{path}: read as {was[2]} → {is_[2]}")
        else:
            out.append(f"{path}: modified (same size, a later modification time)")
    if len(out) > most:
        out = [*out[:most], f"{len(out) - most} more"]
    return out


def lock(folder: str) -> int:
    """Hold the conversion's lock in ``folder`` (an open descriptor; it ends with the process).

    Raises:
        StateInUseError: another conversion into the same output runs.
    """
    path = os.path.join(folder, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateInUseError(f"{folder}: another tfrecordd convert writes this output") from None
    return fd


class DeadLetterFile:
    """The dead-letter file, cut back to ``size`` bytes on opening (what a killed run wrote
    after its last state), appended to, fsynced on :meth:`sync`."""

    def __init__(self, fs: FileSystem, path: str, size: int) -> None:
        self.fs = fs
        self.path = path
        self.count = 0
        try:
            self._file: BinaryIO = open(path, "ab", buffering=0)  # noqa: SIM115
            # Never longer than it is: a file removed by hand is not padded to its old size.
            size = min(size, os.fstat(self._file.fileno()).st_size)
            fs.truncate(self._file, size)
        except OSError as e:
            raise DurabilityError(f"{path}: {e.strerror or e}") from e
        self.size = size

    def write(self, dead: DeadLetter) -> None:
        entry: dict[str, Any] = {
            "time": time.time(),
            "source": "convert",
            "where": dead.where,
            "reason": dead.reason,
            "detail": dead.detail,
        }
        try:
            entry["raw"] = dead.raw.decode("utf-8")
        except UnicodeDecodeError:
            entry["raw_base64"] = base64.b64encode(dead.raw).decode("ascii")
        line = orjson.dumps(entry) + b"\n"
        try:
            self.fs.write(self._file, line)
        except OSError as e:
            raise DurabilityError(f"{self.path}: {e.strerror or e}") from e
        self.size += len(line)
        self.count += 1

    def sync(self) -> None:
        try:
            self.fs.fsync(self._file)
        except OSError as e:
            raise DurabilityError(f"{self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        self._file.close()
