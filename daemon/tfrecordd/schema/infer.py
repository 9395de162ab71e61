"""A feature table inferred from a sample of JSON lines or CSV rows (``tfrecordd schema --infer``).

:func:`infer` reads up to ``sample`` lines of each file, as the directory source would split
them, and proposes for each field what the ``example`` encoder takes without dead-lettering any
line of the sample (:mod:`tfrecordd.schema.infer_toml` writes the proposal as TOML):

- the type from the values: integers ``int64``; integers and fractions ``float``; strings
  ``bytes``; RFC 3339 strings ``int64`` with a ``time_unit`` fine enough for their fractions;
  numbers in a plausible epoch range in a field named like a time (``ts``, ``time``,
  ``created_at``...) ``int64`` with ``time_unit = "s"`` (or finer for fractions), or as they are
  for milliseconds and finer (``time_unit`` reads numbers as seconds);
- ``required`` where every line of the sample holds a value (not ``null``, not an empty field);
- ``shape`` as TFDV infers it: ``[]`` or ``[n]`` where every line holds the same non-zero number
  of values, and a nested list's dimensions, which the encoder needs;
- nested objects as ``path`` features (``user.age``);
- what no feature type takes without dead-lettering a line (booleans, numbers and strings in one
  JSON field, lists of objects, ragged nested lists, numbers beyond float32) is left out, with
  the reason.

Lines that are not JSON, not an object, or (CSV) a record of the wrong number of fields are the
lines the daemon dead-letters: :class:`Inference` lists them with their line numbers.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, cast

import orjson

from tfrecordd.errors import EXIT_DATA, EncodeError, InputError, TfrecorddError
from tfrecordd.format.wire import INT64_MAX, INT64_MIN
from tfrecordd.schema.json_values import load_event
from tfrecordd.schema.numtext import parse_rfc3339

__all__ = [
    "MAX_LINE_BYTES",
    "SAMPLE_LINES",
    "Field",
    "Inference",
    "InferenceError",
    "Misfit",
    "infer",
    "input_format",
    "read_text",
]

SAMPLE_LINES = 10_000
"""Lines read from each file by default."""
MAX_LINE_BYTES = 1 << 20
"""A longer line is a misfit, as the directory source's default ``max_line_bytes`` makes it."""
MAX_FIELDS = 1000
"""Fields tracked at most: a JSON map keyed by ids has a field per id, none worth a feature."""

InputFormat = Literal["jsonl", "csv"]
Kind = Literal["int", "bigint", "float", "huge", "str", "time", "bool", "null", "object"]
"""What one value is: an int64; an integer beyond int64 that a float32 holds; a number with a
fraction; a number beyond float32; a string; an RFC 3339 string; ``true``/``false``; ``null``
(in a list); an object (in a list)."""

_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
_FLOAT_WORDS = frozenset(s + w for s in ("", "+", "-") for w in ("nan", "inf", "infinity"))
_FRACTION = re.compile(r"[0-9]{2}:[0-9]{2}:[0-9]{2}\.([0-9]+)")
_NUMBER_PARTS = re.compile(r"\s*[+-]?[0-9]*(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?\s*")


class InferenceError(TfrecorddError):
    """A file gives nothing to infer from: a CSV header that cannot be read, or no line fits."""

    exit_code = EXIT_DATA


@dataclass(frozen=True)
class Misfit:
    """A line that did not fit (the daemon dead-letters it): where, and why."""

    file: str
    line: int
    reason: str


@dataclass
class Field:
    """What the sample held at one path of the events (a top-level key, or a key of a nested
    object): how many lines hold a value, the kinds of its values, their list shapes."""

    path: tuple[str, ...]
    present: int = 0
    """Lines holding a value (not ``null``, not an empty CSV field; an empty list counts)."""
    objects: int = 0
    """Lines where the value is an object (its keys are fields of their own)."""
    scalars: int = 0
    """Lines where the value is one value, not a list."""
    shapes: Counter[tuple[int, ...]] = field(default_factory=Counter)
    """The dimensions of each list value (``(3,)``, ``(2, 2)``); ragged nested lists: ``()``."""
    kinds: Counter[str] = field(default_factory=Counter)
    """How many values (list elements included) of each :data:`Kind`."""
    fraction_digits: int = 0
    """The most digits of a fraction of a second among RFC 3339 strings and fractions."""
    low: float | None = None
    high: float | None = None
    """The smallest and largest number seen (for epoch ranges)."""
    nonfinite: int = 0
    """CSV fields ``nan`` or ``inf``: a float, never a time."""

    def number(self, value: float) -> None:
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)


@dataclass
class Inference:
    """What :func:`infer` read: the fields in order of first sight, the lines that did not fit."""

    format: InputFormat
    files: list[tuple[str, int, bool]] = field(default_factory=list)
    """Each file read: its name, lines sampled, and whether that was all of it."""
    records: int = 0
    """Lines (CSV: records) that fit: the ones the fields describe."""
    fields: dict[tuple[str, ...], Field] = field(default_factory=dict)
    misfits: list[Misfit] = field(default_factory=list)
    """The first :data:`shown` misfits."""
    misfit_count: int = 0
    untracked: int = 0
    """Fields beyond :data:`MAX_FIELDS`, not described."""
    shown: int = 20

    def misfit(self, file: str, line: int, reason: str) -> None:
        self.misfit_count += 1
        if len(self.misfits) < self.shown:
            self.misfits.append(Misfit(file, line, reason))

    def field_at(self, path: tuple[str, ...]) -> Field | None:
        found = self.fields.get(path)
        if found is None:
            if len(self.fields) >= MAX_FIELDS:
                self.untracked += 1
                return None
            found = self.fields[path] = Field(path)
        return found


def input_format(path: str) -> InputFormat | None:
    """The format a file's suffix says (``.jsonl``, ``.json``, ``.ndjson``, ``.csv``, each
    perhaps ``.gz``), or ``None``."""
    name = path.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    return None


class _IntText(str):
    """A JSON integer, as its text: orjson reads one beyond 64 bits as a float."""


class _FloatText(str):
    """A JSON number with a fraction or an exponent, as its text."""


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


_TEXT_JSON = json.JSONDecoder(
    parse_int=_IntText, parse_float=_FloatText, parse_constant=_no_constant
)


def _fits_float32(value: float | int) -> bool:
    try:
        struct.pack("<f", value)
    except (OverflowError, struct.error):
        return False
    return True


def _digits_after_point(text: str) -> int:
    """Digits of ``text``'s fraction a count of a finer unit needs (``1.5e-1`` needs 2)."""
    match = _NUMBER_PARTS.fullmatch(text)
    if match is None:
        return 0
    fraction = (match.group(1) or "").rstrip("0")
    exponent = int(match.group(2)) if match.group(2) and len(match.group(2)) < 6 else 0
    return max(0, min(9, len(fraction) - exponent))


def _time_kind(text: str, fld: Field) -> bool:
    try:
        seconds = parse_rfc3339(text, 1)
    except EncodeError:
        return False
    fld.number(seconds)
    fraction = _FRACTION.search(text)
    if fraction is not None:
        digits = len(fraction.group(1).rstrip("0"))
        fld.fraction_digits = max(fld.fraction_digits, min(digits, 9))
    return True


def _number_kind(text: str, integer: bool, fld: Field) -> Kind:
    """The kind of a number written as ``text`` (JSON or CSV), noting its range and digits."""
    if integer:
        stripped = text.strip()
        if len(stripped) > 400:  # far beyond any float32; int() refuses 4301 digits
            return "huge"
        value = int(stripped)
        if INT64_MIN <= value <= INT64_MAX:
            fld.number(value)
            return "int"
        return "bigint" if _fits_float32(value) else "huge"
    number = float(text)
    if number != number or number in (float("inf"), float("-inf")):
        # nan and inf are words in CSV only (JSON has no such numbers); 1e400 overflows.
        if text.strip().lower() not in _FLOAT_WORDS:
            return "huge"
        fld.nonfinite += 1
        return "float"
    if not _fits_float32(number):
        return "huge"
    fld.number(number)
    fld.fraction_digits = max(fld.fraction_digits, _digits_after_point(text))
    return "float"


def _json_kind(value: Any, fld: Field) -> Kind:
    cls = value.__class__
    if cls is _IntText or cls is _FloatText:
        return _number_kind(value, cls is _IntText, fld)
    if cls is str:
        return "time" if _time_kind(value, fld) else "str"
    if cls is bool:
        return "bool"
    if value is None:
        return "null"
    return "object"


def _csv_kind(text: str, fld: Field) -> Kind:
    if _INT_TEXT.fullmatch(text) is not None:
        return _number_kind(text, True, fld)
    if _DECIMAL_TEXT.fullmatch(text) is not None or text.strip().lower() in _FLOAT_WORDS:
        return _number_kind(text, False, fld)
    return "time" if _time_kind(text.strip(), fld) else "str"


def _leaves(value: list[Any]) -> tuple[tuple[int, ...], list[Any]]:
    """A list's dimensions (``()`` if ragged) and its values flattened row-major."""
    dims: list[int] = []
    probe: Any = value
    while isinstance(probe, list):
        dims.append(len(probe))
        probe = probe[0] if probe else None
    out: list[Any] = []
    regular = True
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:  # a stack, not recursion: lists nest deeper than Python recurses
        x, depth = stack.pop()
        if isinstance(x, list):
            if depth >= len(dims) or len(x) != dims[depth]:
                regular = False
            stack.extend((e, depth + 1) for e in reversed(x))
        else:
            if depth != len(dims):
                regular = False
            out.append(x)
    return (tuple(dims) if regular else ()), out


def _observe_json(inf: Inference, event: dict[str, Any]) -> None:
    stack: list[tuple[tuple[str, ...], Any]] = [((k,), v) for k, v in event.items()]
    stack.reverse()
    while stack:
        path, value = stack.pop()
        if value is None:
            continue
        fld = inf.field_at(path)
        if fld is None:
            continue
        if value.__class__ is dict:
            fld.objects += 1
            children = [((*path, k), v) for k, v in value.items()]
            stack.extend(reversed(children))
            continue
        fld.present += 1
        if value.__class__ is list:
            shape, leaves = _leaves(value)
            fld.shapes[shape] += 1
            for leaf in leaves:
                fld.kinds[_json_kind(leaf, fld)] += 1
        else:
            fld.scalars += 1
            fld.kinds[_json_kind(value, fld)] += 1


def _lines(f: IO[bytes], limit: int) -> Iterator[tuple[int, bytes | None]]:
    """Each line's number and bytes (``None`` past :data:`MAX_LINE_BYTES`), at most ``limit``."""
    number = 0
    while number < limit:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (more := f.readline(MAX_LINE_BYTES)) and not more.endswith(b"\n"):
                pass
            yield number, None
            continue
        yield number, line


def _read_jsonl(inf: Inference, name: str, f: IO[bytes], sample: int) -> tuple[int, bool]:
    number = 0
    for number, line in _lines(f, sample):
        if line is None:
            inf.misfit(name, number, f"longer than {MAX_LINE_BYTES} bytes")
            continue
        if not line.strip():
            continue  # the daemon skips blank lines
        line = line.removesuffix(b"\n")
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            try:
                parsed, _ = load_event(line)  # a number beyond a double's range is JSON
            except orjson.JSONDecodeError:
                inf.misfit(name, number, f"not JSON: {e}")
                continue
        if parsed.__class__ is not dict:
            kind = "a list" if isinstance(parsed, list) else type(parsed).__name__
            inf.misfit(name, number, f"not an object: got {kind}")
            continue
        try:
            event = _TEXT_JSON.decode(line.decode())
        except (ValueError, RecursionError) as e:
            inf.misfit(name, number, f"not read: {e}")
            continue
        inf.records += 1
        _observe_json(inf, event)
    return number, f.read(1) == b""


def _text_lines(f: IO[bytes], sample: int, bad: set[int]) -> Iterator[str]:
    for number, line in _lines(f, sample):
        if line is None:
            bad.add(number)
            yield "\n"
            continue
        try:
            yield line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            bad.add(number)
            yield line.decode("utf-8", "replace")


def _read_csv(
    inf: Inference, name: str, f: IO[bytes], sample: int, delimiter: str
) -> tuple[int, bool]:
    bad: set[int] = set()
    lines = _text_lines(f, sample, bad)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    header: list[str] | None = None
    end = 0
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            end = reader.line_num
            inf.misfit(name, start, f"not a valid CSV record: {e}")
            continue
        end = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # the daemon skips blank records
        if header is None:
            if row[0].startswith("#TYPE "):
                continue  # PowerShell's Export-Csv preamble, which the daemon skips too
            if bad.intersection(range(start, end + 1)):
                raise InferenceError(f"{name}: the header row is not UTF-8 text")
            header = [h or f"Unnamed: {i}" for i, h in enumerate(row)]
            if len(set(header)) != len(header):
                twice = next(h for h in header if header.count(h) > 1)
                raise InferenceError(f"{name}: the header row names {twice!r} twice")
            continue
        if bad.intersection(range(start, end + 1)):
            inf.misfit(name, start, f"not UTF-8 text, or longer than {MAX_LINE_BYTES} bytes")
            continue
        if len(row) != len(header):
            fields = "1 field" if len(row) == 1 else f"{len(row)} fields"
            inf.misfit(name, start, f"{fields}, the header {len(header)}")
            continue
        inf.records += 1
        for column, text in zip(header, row, strict=True):
            fld = inf.field_at((column,))
            if fld is None or text == "":
                continue
            fld.present += 1
            fld.scalars += 1
            fld.kinds[_csv_kind(text, fld)] += 1
    return end, f.read(1) == b""


def _open(path: str) -> IO[bytes]:
    p = Path(path)
    if not p.exists():
        raise InputError(path, "no such file")
    if not p.is_file():
        raise InputError(path, "not a regular file")
    raw = p.open("rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return cast("IO[bytes]", gzip.GzipFile(fileobj=raw, mode="rb"))
    raw.seek(0)
    return raw


def infer(
    paths: Sequence[str],
    fmt: InputFormat | None = None,
    *,
    sample: int = SAMPLE_LINES,
    delimiter: str = ",",
) -> Inference:
    """Read up to ``sample`` lines of each file (``fmt``: by suffix where ``None``) and gather
    what each field holds; :func:`tfrecordd.schema.infer_toml.propose` turns it into features.
    Raises :class:`~tfrecordd.errors.InputError` for a file that cannot be read,
    :class:`InferenceError` for files of both formats, an unknown suffix, or a CSV header that
    cannot be read."""
    formats = {p: fmt or input_format(p) for p in paths}
    unknown = [p for p, f in formats.items() if f is None]
    if unknown:
        raise InferenceError(
            f"{unknown[0]}: cannot tell JSON lines from CSV by its name: give --format jsonl|csv"
        )
    kinds = set(formats.values())
    if len(kinds) > 1:
        raise InferenceError("JSON lines and CSV files given together: infer each on its own")
    inf = Inference(format="csv" if "csv" in kinds else "jsonl")
    for path in paths:
        with _open(path) as f:
            try:
                if inf.format == "csv":
                    lines, whole = _read_csv(inf, path, f, sample, delimiter)
                else:
                    lines, whole = _read_jsonl(inf, path, f, sample)
            except (OSError, EOFError, gzip.BadGzipFile) as e:
                raise InputError(path, f"cannot be read: {e}") from None
        inf.files.append((path, lines, whole))
    return inf


def read_text(text: str, fmt: InputFormat, *, name: str = "<text>") -> Inference:
    """:func:`infer` on ``text`` itself (every line of it), for callers that hold the sample."""
    inf = Inference(format=fmt)
    f = io.BytesIO(text.encode())
    lines, whole = (
        _read_csv(inf, name, f, 1 << 62, ",")
        if fmt == "csv"
        else _read_jsonl(inf, name, f, 1 << 62)
    )
    inf.files.append((name, lines, whole))
    return inf
