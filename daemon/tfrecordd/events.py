"""What flows through the pipeline between the plugins: the events a source reads
(:class:`RawEvent`, lines still to split in :class:`Lines`), the batches it sends
(:class:`RawBatch`) and what an encoder makes of them (:class:`EncodeResult`, with a
:class:`Failure` per event it could not encode, for a reason of the closed set
:class:`FailureReason`).

Plugins import these from :mod:`tfrecordd.plugin`, which re-exports them.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate
from typing import Any, Literal, NamedTuple, SupportsIndex

from tfrecordd.errors import TokenVersionError

Token = Any
"""A source's JSON-serializable acknowledgement token (positions covered by one batch). Each
source types its own (a ``TypedDict`` with a version field ``"v"``, read by
:func:`token_version`)."""


EventFormat = Literal["csv", "file"] | None
"""How an event is to be read (:attr:`RawEvent.format`)."""


class FailureReason(StrEnum):
    """Why an event went to the dead letters: the ``reason`` of its dead letter and the label of
    ``tfrecordd_events_dead_lettered_total``, so a closed set."""

    REJECTED = "rejected"
    """The source refused it before encoding (:attr:`RawEvent.error`: over a size limit, not a
    valid CSV record, no payload field...)."""
    MALFORMED = "malformed"
    """Not readable as what it claims to be: invalid JSON, a corrupt image, a record TensorFlow
    would not parse."""
    SCHEMA = "schema"
    """Readable, but its values do not fit the declared features."""
    FORMAT = "format"
    """An event of a kind the encoder does not take (a CSV row for an image encoder...)."""
    LABEL = "label"
    """A file whose folder names no configured label (the ``image`` encoder's
    ``unknown_label = "dead-letter"``)."""
    TOO_LARGE = "too-large"
    """Over a limit of the encoder's (an image's pixel count)."""
    ENCODER_ERROR = "encoder-error"
    """The encoder raised on this event instead of reporting it (a bug in the encoder)."""
    ROUTE = "route"
    """Its source routes events by a field, and its value names no dataset (and the route has
    no ``default``)."""
    EVENT_TIME = "event-time"
    """Its dataset is partitioned by event time, and its record holds no readable time."""
    LATE = "late"
    """Its time partition was already marked complete (``completion.late = "dead-letter"``)."""


class Failure(NamedTuple):
    """One event an encoder could not encode."""

    at: int
    """The event's index in the batch."""
    reason: FailureReason
    detail: str
    """Human-readable: what is wrong, naming the feature where there is one."""


@dataclass(slots=True)
class RawEvent:
    """One event as a source read it."""

    payload: bytes
    """The raw bytes (a JSON line, a datagram, a file's content...), kept for dead letters."""
    where: str
    """A human-readable position (``file:offset``, a stream entry ID), for dead letters and logs."""
    value: Any = None
    """An already-structured value (a CSV row as a dict, a file's attributes), if the source has
    one; encoders use it instead of parsing ``payload``."""
    format: EventFormat = None
    """How to read the event: ``None`` means ``payload`` is one JSON value; ``"csv"`` means
    ``value`` is a row of text fields (header name → string) to convert through the schema;
    ``"file"`` means ``payload`` is a whole file's bytes and ``value`` its attributes
    (``filename``, ``label``: the parent folder's name, ``path``: relative to the spool)."""
    error: str | None = None
    """Set by the source when the event is already known to be bad (e.g. a line over the size
    limit): it goes straight to the dead letters with this reason."""


@dataclass(slots=True)
class Lines:
    """Events that are the lines of one buffer (JSON lines), left for the encode stage to split.

    A source that reads newline-delimited JSON in bulk sends its lines this way, so the daemon's
    own process does no work per event: the split happens where the events are encoded (in an
    encode worker process, with ``encode_workers > 1``). An empty or whitespace-only line is no
    event; a line longer than ``max_line`` is an event with ``error`` set, carrying its first
    ``max_line`` bytes.
    """

    data: bytes
    """Whole lines, each ended by ``\\n`` except perhaps the last (at the end of the input)."""
    where: str
    """Where the lines come from (a file name); an event's ``where`` is ``{where}:{offset}``,
    or ``{where}:line {n}:{offset}`` when :attr:`line` is known (the offset stays last)."""
    offset: int
    """The position of ``data[0]`` in its stream."""
    max_line: int
    """A longer line is refused (dead-lettered with its first ``max_line`` bytes)."""
    line: int = 0
    """The number of the line ``data[0]`` starts, 1 for a stream's first; 0 if not known."""
    _counted: tuple[int, int] = field(default=(0, 0), init=False, repr=False, compare=False)
    """An offset into ``data`` and the newlines before it: :meth:`at` counts on from there."""

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # With protocol 5 the bytes can travel out of band (to an encode worker, as they are).
        data = pickle.PickleBuffer(self.data) if int(protocol) >= 5 else self.data
        return (Lines, (data, self.where, self.offset, self.max_line, self.line))

    def split(self) -> tuple[list[bytes], list[RawEvent]]:
        """``(payloads, refused)``: the events' payloads in order (each is one JSON value), and
        the refused lines as events, their ``where`` set. Where an event came from is found
        only when needed, by :meth:`offsets`."""
        lines = self._lines()
        if self._plain(lines):
            return lines, []
        payloads: list[bytes] = []
        refused: list[RawEvent] = []
        limit = self.max_line
        for line, at in zip(lines, self._starts(lines), strict=False):
            if len(line) > limit:
                error = f"record longer than max_line_bytes ({limit}); first bytes kept"
                refused.append(RawEvent(line[:limit], self.at(at), error=error))
            elif line and not line.isspace():
                payloads.append(line)
        return payloads, refused

    def offsets(self) -> list[int]:
        """The stream offset of each payload :meth:`split` gives, in the same order."""
        lines = self._lines()
        starts = self._starts(lines)
        if self._plain(lines):
            return starts[:-1]
        limit = self.max_line
        return [
            at
            for line, at in zip(lines, starts, strict=False)
            if len(line) <= limit and line and not line.isspace()
        ]

    def at(self, offset: int) -> str:
        """The ``where`` of the event at ``offset``, with its line number if :attr:`line` is
        known."""
        if not self.line:
            return f"{self.where}:{offset}"
        # Asked in order of offset (a batch's dead letters): each count goes on from the last,
        # so a batch of bad lines costs one pass over it, not one per line.
        pos = offset - self.offset
        last, newlines = self._counted
        if pos < last:
            last, newlines = 0, 0
        newlines += self.data.count(b"\n", last, pos)
        self._counted = (pos, newlines)
        return f"{self.where}:line {self.line + newlines}:{offset}"

    def _lines(self) -> list[bytes]:
        lines = self.data.split(b"\n")
        if not lines[-1]:
            lines.pop()  # after the last newline (or all of an empty buffer)
        return lines

    def _starts(self, lines: list[bytes]) -> list[int]:
        # Where each line starts, and where one after the last would: running sums in C of the
        # lines' lengths, plus one newline per line before.
        sums = accumulate(map(len, lines), initial=self.offset)
        return [s + i for i, s in enumerate(sums)]

    def _plain(self, lines: list[bytes]) -> bool:
        """No line is blank or too long (checked without a Python step per line)."""
        if not lines or max(map(len, lines)) > self.max_line:
            return False
        # The least line starts with its least first byte: when that is no whitespace, no line
        # is blank (JSON values start with one of `{["-0123456789tfn`).
        least = min(lines)
        return (bool(least) and least[0] > 32) or not any(not x or x.isspace() for x in lines)


@dataclass(slots=True)
class RawBatch:
    """A batch of events from one source, with the token that acknowledges all of them."""

    source: str
    events: list[RawEvent]
    token: Token
    """Positions covered; may cover no events (an empty file's end, say) and still needs acking."""
    lines: Lines | None = None
    """More events, as lines to split (after ``events``, in order)."""

    def expand(self) -> list[RawEvent]:
        """Every event of the batch, ``lines`` split, each with its ``where`` (for tests and
        tools: the daemon splits ``lines`` only where it encodes them)."""
        lines = self.lines
        if lines is None:
            return list(self.events)
        payloads, refused = lines.split()
        offsets = lines.offsets()
        placed = [(at, RawEvent(p, lines.at(at))) for p, at in zip(payloads, offsets, strict=True)]
        placed += [(int(ev.where.rpartition(":")[2]), ev) for ev in refused]
        return self.events + [ev for _, ev in sorted(placed, key=lambda p: p[0])]


@dataclass(slots=True)
class EncodeResult:
    """What an encoder made of a batch: records, and the events that failed with a reason."""

    records: list[bytes] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    """The events that failed, by their index in the batch."""


def not_json(error: ValueError) -> str:
    """The detail of the ``malformed`` failure of a payload that is not JSON (``error``: what
    :func:`tfrecordd.schema.json_values.load_event` raised): encoders and routes word it alike."""
    return f"not valid JSON: {error}"


def token_version(token: Mapping[str, Any], source: str, newest: int) -> int:
    """The version (``"v"``) of a source's token, 1 when it has none (tokens journalled before
    tokens had versions). Raises :class:`TokenVersionError` naming ``source`` (its name and type,
    or its type alone) for a version above ``newest`` or not a version at all: a token of a
    newer tfrecordd is refused, never misread."""
    version = token.get("v", 1)
    if type(version) is not int or not 1 <= version <= newest:
        raise TokenVersionError(source, version, newest)
    return version
