"""One encode request and what it gives: the values that travel between the encode stage and an
encoder, whether that encoder runs in the daemon's thread or in a worker process.

An :class:`EncodeRequest` names the encoder and carries a batch's events and lines; :func:`encode`
turns it into an :class:`Outcome`: records (framed and compressed into a unit of their own when
they are large enough, :data:`PACK_MIN_BYTES`), and the failures. The same function runs in both
places; only the crossing differs: a request pickled for a worker ships its events as one joined
payload (see :meth:`EncodeRequest.__reduce__`).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tfrecordd.format.compress import Compressor, Unit
from tfrecordd.format.compression import Compression
from tfrecordd.format.framing import framed_size
from tfrecordd.format.writer import Packed, frame, pack
from tfrecordd.plugin import (
    Encoder,
    EncodeResult,
    EventFormat,
    Failure,
    FailureReason,
    Lines,
    RawEvent,
    Token,
)

log = logging.getLogger("tfrecordd")

PACK_MIN_BYTES = 64 * 1024
"""Batches framing to fewer bytes are framed only, and compressed where the shard's writer holds
them with the writes around them, instead of becoming a unit of their own: a trickle of small
batches (or a partitioned dataset's small parts) still compresses in large units."""

ENCODER_ERROR = FailureReason.ENCODER_ERROR
"""The dead-letter reason of an event on which the encoder raised instead of reporting it."""

EventFailure = tuple[RawEvent, FailureReason, str]
"""An event that cannot be written, the reason (a metric label) and a detail for people."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class EncodeRequest:
    """One batch to encode: its good events, then the events of its lines (if any)."""

    encoder: str
    """The name of the encoder (a key of the config's ``encoders``)."""
    events: list[RawEvent]
    lines: Lines | None
    compression: Compression
    level: int | None
    arrival: float = 0.0
    """When the batch reached the encode stage (``time.time()``): the arrival time that
    ``partition.time = "arrival"`` files it by."""
    joins: bool = False
    """Whether it may be joined to the request before it (:mod:`~tfrecordd.pipeline.joining`):
    both of one source, with no other source's batch between them."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The main process is the pipeline's narrow part, and pickling one joined payload costs
        # a small part of pickling a thousand small events (the worker splits it, in parallel).
        # Only what encoding reads travels: payload, value and format.
        payloads = [ev.payload for ev in self.events]
        extras = [
            (i, ev.value, ev.format)
            for i, ev in enumerate(self.events)
            if ev.value is not None or ev.format is not None
        ]
        shipment = (b"".join(payloads), array("Q", map(len, payloads)), extras)
        return (
            _received,
            (
                self.encoder,
                shipment,
                self.lines,
                self.compression,
                self.level,
                self.arrival,
                self.joins,
            ),
        )


def _received(
    encoder: str,
    shipment: tuple[bytes, array[int], list[tuple[int, Any, EventFormat]]],
    lines: Lines | None,
    compression: Compression,
    level: int | None,
    arrival: float = 0.0,
    joins: bool = False,
) -> EncodeRequest:
    blob, lengths, extras = shipment
    events = []
    at = 0
    for n in lengths:
        events.append(RawEvent(blob[at : at + n], ""))
        at += n
    for i, value, fmt in extras:
        events[i].value, events[i].format = value, fmt
    return EncodeRequest(encoder, events, lines, compression, level, arrival, joins)


@dataclass(frozen=True, slots=True)
class Part:
    """The records of a batch that go to one shard: one dataset's, in one partition folder."""

    dataset: str
    folder: str
    """The partition folder, relative to the dataset's output (``""``: none)."""
    records: Packed
    """The records framed, and compressed where they were worth a unit of their own
    (:func:`packed`)."""
    times: tuple[float, float] | None = None
    """The earliest and latest event time of the records (epoch seconds), where known."""

    def __reduce__(self) -> tuple[Any, ...]:
        # A dataclass's own pickling reads its fields() for each instance: a batch's parts
        # cross between processes by the hundred, and this is several times faster.
        return (Part, (self.dataset, self.folder, self.records, self.times))

    @property
    def count(self) -> int:
        """How many records."""
        return self.records.records


@dataclass(frozen=True, slots=True)
class Outcome:
    """What encoding a request gave: records (:func:`packed`), failures of the events sent
    (by index), failures of the events split from the request's lines (with the event: the
    daemon's process never split them), and how many events the lines held. A request for a
    routed or partitioned source gives ``parts`` instead of ``records``, and counts the values
    sent to a fallback partition in ``fallbacks`` (``(dataset, reason) → count``)."""

    records: Packed
    failures: list[Failure]
    line_failures: list[EventFailure]
    line_events: int
    parts: list[Part] | None = None
    fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)
    joined: bool = False
    """Whether its parts went with the outcome before it: its batch and that one are written
    and acknowledged as one (:mod:`~tfrecordd.pipeline.joining`)."""


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch after encoding: its records by the shard they go to (each part's records framed
    and compressed into a unit already, when large enough), failures for the dead letters."""

    source: str
    parts: list[Part]
    token: Token
    events: int
    failures: list[EventFailure]
    more: tuple[Token, ...] = ()
    """The positions of the batches of the same source joined into this one, in order, after
    ``token`` (:mod:`~tfrecordd.pipeline.joining`): written and acknowledged with it."""

    @property
    def tokens(self) -> tuple[Token, ...]:
        """Every position it holds, in order."""
        return (self.token, *self.more)

    @property
    def batches(self) -> int:
        """How many of its source's batches it holds."""
        return 1 + len(self.more)

    @property
    def count(self) -> int:
        """Records for the shards."""
        return sum(p.count for p in self.parts)


def guarded(encode: Callable[[list[_T]], EncodeResult], items: list[_T]) -> EncodeResult:
    """``encode(items)``; if it raises, each item alone, so that one event an encoder cannot
    take (whatever it raises) fails alone, as :data:`ENCODER_ERROR`, and the others go on."""
    try:
        return encode(items)
    except Exception:
        log.exception("the encoder raised on a batch of %d events: encoding each alone", len(items))
    result = EncodeResult()
    for i, item in enumerate(items):
        try:
            one = encode([item])
        except Exception as e:
            result.failures.append(
                Failure(i, ENCODER_ERROR, f"the encoder raised {type(e).__name__}")
            )
            continue
        result.records.extend(one.records)
        result.failures.extend(Failure(i, reason, detail) for _, reason, detail in one.failures)
    return result


def encode(request: EncodeRequest, encoder: Encoder) -> Outcome:
    """Encode the request's events and then the events of its lines with ``encoder``; frame
    and compress the records into a unit of their own when they are large enough to be worth
    one."""
    events, lines = request.events, request.lines
    result = guarded(encoder.encode_batch, events) if events else EncodeResult()
    records, failures = result.records, result.failures
    line_failures: list[EventFailure] = []
    line_events = 0
    if lines is not None:
        payloads, refused = lines.split()
        line_events = len(payloads) + len(refused)
        line_failures = [(ev, FailureReason.REJECTED, ev.error or "") for ev in refused]
        result = guarded(encoder.encode_lines, payloads)
        records = records + result.records if records else result.records
        if result.failures:
            offsets = lines.offsets()
            line_failures += [
                (RawEvent(payloads[i], lines.at(offsets[i])), reason, detail)
                for i, reason, detail in result.failures
            ]
    return Outcome(
        packed(records, request.compression, request.level), failures, line_failures, line_events
    )


def packed(records: list[bytes], compression: Compression, level: int | None) -> Packed:
    """``records`` framed and compressed into a unit of their own if they are large enough to
    be worth one (:data:`PACK_MIN_BYTES`), else framed only
    (:func:`~tfrecordd.format.writer.frame`): either way one buffer, where a list of records
    would cross to the daemon's process as one object each."""
    if framed_size(records) >= PACK_MIN_BYTES:
        return pack(records, compression, level)
    return frame(records)


def packed_framed(
    data: bytes, lengths: array[int], compression: Compression, level: int | None
) -> Packed:
    """Records framed already (``data``, with their ``lengths``) as :func:`packed` makes
    them."""
    if len(data) >= PACK_MIN_BYTES:
        return Packed(Compressor.unit(compression, level, [data]), lengths)
    return Packed(Unit(Compression.NONE, data, len(data)), lengths)


def encode_events(
    encoder: Encoder,
    events: Sequence[RawEvent],
    lines: Lines | None,
    compression: Compression,
    level: int | None,
) -> Outcome:
    """:func:`encode` of a request of ``events`` and ``lines`` (for tests and benchmarks)."""
    return encode(EncodeRequest("", list(events), lines, compression, level), encoder)
