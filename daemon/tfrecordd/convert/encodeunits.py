"""A unit of input read and encoded: what each encode process of a conversion runs.

A unit's bytes are framed into events as the directory source frames them (JSON lines as
:class:`~tfrecordd.events.Lines`, CSV records by the source's own record scanner, whole files
with their name and folder), cut into batches, and each batch encoded by
:func:`tfrecordd.pipeline.encoding.encode`, the daemon's encode function: the same records, the
same dead letters, records packed (framed and compressed) where they are encoded when large
enough. The batches of a unit depend on its bytes only.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from tfrecordd.convert.inputs import (
    BATCH_BYTES,
    BATCH_EVENTS,
    COMPRESSED,
    InputFile,
    ReadSettings,
    Unit,
)
from tfrecordd.errors import InputError
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import Packed
from tfrecordd.pipeline.encoding import EncodeRequest, encode
from tfrecordd.plugin import Encoder, EncoderConfig, FailureReason, Lines, RawEvent

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input record that is in no shard, and why."""

    where: str
    reason: str
    detail: str
    raw: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a unit, encoded: its records go to one shard."""

    records: list[bytes] | Packed
    dead: list[DeadLetter]
    events: int
    """Input records it covers (written or dead-lettered)."""
    input_bytes: int

    @property
    def count(self) -> int:
        """Records written."""
        r = self.records
        return r.records if isinstance(r, Packed) else len(r)


@dataclass(frozen=True, slots=True)
class EncodeSetup:
    """What every encode process is given once: the dataset's encoder and how to read."""

    encoder: EncoderConfig
    compression: Compression
    level: int | None
    read: ReadSettings
    batch_bytes: int = BATCH_BYTES
    """About how many input bytes a batch holds: less than a shard, so shards are cut near
    their cap."""


_setup: EncodeSetup | None = None
_encoder: Encoder | None = None


def init_process(setup: EncodeSetup, *, worker: bool = True) -> None:
    """Make this process encode by ``setup`` (a worker ignores Ctrl-C: its parent stops it)."""
    global _setup, _encoder
    if worker:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _die_with_parent()
    _setup, _encoder = setup, setup.encoder.build()


def _die_with_parent() -> None:
    """Have the kernel kill this worker when its parent dies (Linux): a conversion killed with
    SIGKILL leaves no worker behind holding its lock (inherited across the fork)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request took
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def encode_unit(unit: Unit) -> list[Batch]:
    """The unit's batches, encoded, in order (after :func:`init_process`)."""
    assert _setup is not None
    assert _encoder is not None
    first = unit.files[0]
    if first.format != "whole-file" and first.path.endswith(COMPRESSED):
        return [_rejected(first, 0, "a compressed file: decompress it first (gzip -dk, zstd -d)")]
    if first.format == "jsonl":
        return _jsonl(unit, _setup, _encoder)
    if first.format == "csv":
        return _csv(unit, _setup, _encoder)
    return _whole_files(unit, _setup, _encoder)


def _read(path: str, rel: str, start: int, end: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    except OSError as e:
        raise InputError(rel, f"cannot read: {e.strerror or e}") from None
    if len(data) != end - start:
        raise InputError(rel, "changed while being converted (it is shorter)")
    return data


def _request(events: list[RawEvent], lines: Lines | None, setup: EncodeSetup) -> EncodeRequest:
    return EncodeRequest("", events, lines, setup.compression, setup.level)


def _jsonl(unit: Unit, setup: EncodeSetup, encoder: Encoder) -> list[Batch]:
    f = unit.files[0]
    data = _read(f.path, f.rel, unit.start, unit.end)
    at = 0
    if unit.start == 0 and data.startswith(BOM):
        at = len(BOM)
    batches: list[Batch] = []
    while at < len(data):
        end = len(data)
        if end - at > setup.batch_bytes:
            end = data.find(b"\n", at + setup.batch_bytes) + 1 or len(data)
        lines = Lines(data[at:end], f.rel, unit.start + at, setup.read.max_line_bytes)
        out = encode(_request([], lines, setup), encoder)
        dead = [DeadLetter(ev.where, str(r), d, ev.payload) for ev, r, d in out.line_failures]
        batches.append(Batch(out.records, dead, out.line_events, end - at))
        at = end
    return batches


def _encoded(events: list[RawEvent], setup: EncodeSetup, encoder: Encoder, size: int) -> Batch:
    """A batch of events: those the reader refused dead-lettered as ``rejected`` (as the daemon's
    encode stage does), the others encoded."""
    good = [ev for ev in events if ev.error is None]
    dead = [
        DeadLetter(ev.where, str(FailureReason.REJECTED), ev.error or "", ev.payload)
        for ev in events
        if ev.error is not None
    ]
    if not good:
        return Batch([], dead, len(events), size)
    out = encode(_request(good, None, setup), encoder)
    dead += [DeadLetter(good[i].where, str(r), d, good[i].payload) for i, r, d in out.failures]
    return Batch(out.records, dead, len(events), size)


def _csv(unit: Unit, setup: EncodeSetup, encoder: Encoder) -> list[Batch]:
    # The directory source's own record scanner and header rules: imported here, where CSV
    # is read, so that converting JSON lines never imports the plugins' CSV code.
    from tfrecordd_plugins.sources import csvrecords

    f = unit.files[0]
    cfg = setup.read
    data = _read(f.path, f.rel, 0, f.size)
    base = len(BOM) if data.startswith(BOM) else 0
    found = csvrecords.split(
        memoryview(data)[base:].tobytes() if base else data,
        True,
        csvrecords.State.FIELD_START,
        ord(cfg.csv_delimiter),
    )
    header: list[str] | None = None
    batches: list[Batch] = []
    events: list[RawEvent] = []
    size = 0
    at = base
    for record, nxt in zip(found.records, found.ends, strict=True):
        n = len(record)
        where = f"{f.rel}:{at}"
        if n > cfg.max_line_bytes:
            error = f"record longer than max_line_bytes ({cfg.max_line_bytes}); first bytes kept"
            if header is None:
                return [_rejected(f, at, "the header row is longer than max_line_bytes")]
            events.append(RawEvent(record[: cfg.max_line_bytes], where, error=error))
        elif header is None:
            if n and not record.isspace() and not csvrecords.preamble(record):
                try:
                    header = csvrecords.header(record, cfg.csv_delimiter, cfg.csv_encoding)
                except csvrecords.BadHeader as e:
                    return [_rejected(f, at, str(e))]
        elif n and not record.isspace():
            events.append(
                csvrecords.event(record, where, header, cfg.csv_delimiter, cfg.csv_encoding)
            )
        size += base + nxt - at
        at = base + nxt
        if len(events) >= BATCH_EVENTS or size >= setup.batch_bytes:
            batches.append(_encoded(events, setup, encoder, size))
            events, size = [], 0
    if events or size or not batches:
        batches.append(_encoded(events, setup, encoder, size + (f.size - at)))
    return batches


def _rejected(f: InputFile, at: int, reason: str) -> Batch:
    """A file whose rest cannot be read, as the directory source refuses one: one dead letter."""
    detail = f"input rejected: {reason}"
    return Batch(
        [], [DeadLetter(f"{f.rel}:{at}", str(FailureReason.REJECTED), detail, b"")], 1, f.size
    )


def _whole_files(unit: Unit, setup: EncodeSetup, encoder: Encoder) -> list[Batch]:
    events: list[RawEvent] = []
    limit = setup.read.max_file_bytes
    for f in unit.files:
        if f.size > limit:
            error = f"file larger than max_file_bytes ({limit})"
            events.append(RawEvent(b"", f.rel, error=error))
            continue
        data = _read(f.path, f.rel, 0, f.size)
        value = {"filename": os.path.basename(f.path), "label": f.label, "path": f.rel}
        events.append(RawEvent(data, f.rel, value=value, format="file"))
    return [_encoded(events, setup, encoder, unit.bytes)]
