"""What a conversion reads: its input files in a stable order, how each is read, and the units of
work they are cut into.

The files are the arguments' regular files, and every regular file under an argument that is a
directory (recursively; names starting with ``.`` or ``_`` are left out, as readers of shards
leave them out), sorted by the path given. A file is read as the dataset's directory source reads
its files (``format``: ``jsonl``, ``csv`` or ``whole-file``): by ``--format``; else by its name
(``.csv`` and ``.tsv`` are CSV, ``.jsonl``, ``.ndjson`` and ``.json`` JSON lines, an image suffix
a whole file); else by the ``format`` of the directory source feeding the dataset, if one does;
else as JSON lines.

A :class:`Unit` is the work one encode process does at once: a byte range of a JSON-lines file
(cut at line ends, about :data:`UNIT_BYTES`), a whole CSV file (its records are only known by
reading it from its start), or a group of whole files. Units depend on the files' bytes and on
the shard options only, never on ``--workers``, so the same inputs always give the same units,
batches and shards.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tfrecordd.errors import InputError

Format = Literal["jsonl", "csv", "whole-file"]

UNIT_BYTES = 4 << 20
"""About how many bytes of JSON lines one unit reads."""
BATCH_BYTES = 512 << 10
"""About how many bytes of input one batch holds (a batch's records go to one shard)."""
BATCH_EVENTS = 4096
"""At most this many CSV records, or whole files, in one batch."""
FILE_BATCH_BYTES = 16 << 20
"""At most about this many bytes of whole files in one unit."""
COMPRESSED = (".gz", ".zst", ".zz", ".bz2", ".xz")
"""Names of compressed files, which convert does not read as lines or CSV records: each is
one dead letter saying so."""
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How input files are read: the directory source's settings of the same names."""

    format: Format | None = None
    """Every file's format (``--format``); ``None``: each file's by its name."""
    default_format: Format = "jsonl"
    """The format of a file whose name says none (a directory source's ``format``)."""
    max_line_bytes: int = 1 << 20
    max_file_bytes: int = 64 << 20
    csv_delimiter: str = ","
    csv_encoding: str = "utf-8"


@dataclass(frozen=True, slots=True)
class InputFile:
    """One file to convert."""

    path: str
    """Its path (absolute)."""
    rel: str
    """Its name in dead letters' ``where`` and in manifests: the argument's path, and the path
    under it for a file found in a directory."""
    label: str
    """Its parent folder's name (a whole file's ``label``)."""
    size: int
    mtime_ns: int
    format: Format


@dataclass(frozen=True, slots=True)
class Unit:
    """The work of one encode call: ``files[0]`` from ``start`` to ``end`` (JSON lines, CSV:
    one file), or each file of ``files`` whole."""

    index: int
    files: tuple[InputFile, ...]
    start: int
    end: int

    @property
    def bytes(self) -> int:
        """Input bytes it covers."""
        return self.end - self.start


def format_of(name: str, settings: ReadSettings) -> Format:
    """How the file called ``name`` is read."""
    if settings.format is not None:
        return settings.format
    lower = name.lower()
    if lower.endswith((".csv", ".tsv")):
        return "csv"
    if lower.endswith(IMAGE_SUFFIXES):
        return "whole-file"
    if lower.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return settings.default_format


def list_inputs(
    args: Sequence[str], settings: ReadSettings, exclude: str | None = None
) -> list[InputFile]:
    """The files the arguments name, in order (see the module's docstring), leaving out the
    folder ``exclude`` (the output: converting into a folder of the input must not read the
    shards back as input on the next run).

    Raises:
        InputError: an argument is missing, or is neither a file nor a directory.
    """
    found: dict[str, InputFile] = {}
    # The output may be named through a symlink (or the inputs may be): compare the folders
    # themselves, not their names.
    out = _identity(exclude) if exclude is not None else None
    out_real = os.path.realpath(exclude) if exclude is not None else None
    for arg in args:
        path = os.path.abspath(arg)
        if not os.path.lexists(path):
            raise InputError(arg, "no such file or directory")
        if os.path.isdir(path):
            if out is not None and _identity(path) == out:
                continue
            for here, dirs, files in os.walk(path):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith((".", "_"))
                    and (out is None or _identity(os.path.join(here, d)) != out)
                )
                for name in sorted(files):
                    if name.startswith((".", "_")):
                        continue
                    full = os.path.join(here, name)
                    rel = os.path.join(arg, os.path.relpath(full, path))
                    label = os.path.basename(here) or os.path.basename(path)
                    _add(found, full, rel, label, settings)
        elif os.path.isfile(path):
            if out_real is not None and os.path.realpath(path).startswith(out_real + os.sep):
                continue
            _add(found, path, arg, os.path.basename(os.path.dirname(path)), settings)
        else:
            raise InputError(arg, "neither a regular file nor a directory")
    return sorted(found.values(), key=lambda f: f.rel)


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the folder ``path`` names, through symlinks; None if none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _add(
    found: dict[str, InputFile], path: str, rel: str, label: str, settings: ReadSettings
) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(rel, f"cannot read: {e.strerror or e}") from None
    if not os.path.isfile(path) or path in found:
        return
    fmt = format_of(path, settings)
    found[path] = InputFile(path, rel, label, st.st_size, st.st_mtime_ns, fmt)


def fingerprint(files: Iterable[InputFile]) -> str:
    """A digest of the inputs as listed: names, sizes, modification times, formats. A resumed
    conversion whose inputs changed is refused, not continued into different shards."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.rel}\0{f.size}\0{f.mtime_ns}\0{f.format}\n".encode())
    return h.hexdigest()


def plan_units(files: Sequence[InputFile], unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """The units of ``files``, in order: JSON lines cut at line ends into about ``unit_bytes``,
    a CSV file whole, runs of whole files up to :data:`BATCH_EVENTS` files or
    :data:`FILE_BATCH_BYTES` (blocking: reads a few bytes at each cut to find a line end)."""
    units: list[Unit] = []
    group: list[InputFile] = []
    group_bytes = 0

    def close_group() -> None:
        nonlocal group, group_bytes
        if group:
            units.append(Unit(len(units), tuple(group), 0, group_bytes))
            group, group_bytes = [], 0

    for f in files:
        if f.format == "whole-file":
            if group and (len(group) >= BATCH_EVENTS or group_bytes + f.size > FILE_BATCH_BYTES):
                close_group()
            group.append(f)
            group_bytes += f.size
            continue
        close_group()
        if f.format == "csv" or f.size <= unit_bytes or f.path.endswith(COMPRESSED):
            units.append(Unit(len(units), (f,), 0, f.size))
            continue
        for start, end in line_cuts(f.path, f.size, unit_bytes):
            units.append(Unit(len(units), (f,), start, end))
    close_group()
    return units


def line_cuts(path: str, size: int, step: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering the file, each ending just after a newline (the last at
    the file's end), each about ``step`` bytes."""
    cuts: list[tuple[int, int]] = []
    start = 0
    with open(path, "rb") as f:
        while start < size:
            at = start + step
            if at >= size:
                cuts.append((start, size))
                break
            f.seek(at)
            end = size
            while chunk := f.read(64 << 10):
                nl = chunk.find(b"\n")
                if nl >= 0:
                    end = at + nl + 1
                    break
                at += len(chunk)
            cuts.append((start, end))
            start = end
    return cuts
