"""CSV records in a byte stream: where each one ends, and each one as a row or a dead letter.

A record ends at a newline outside a quoted field, by the same grammar Python's :mod:`csv`
reader applies (the default dialect: ``"`` quotes, ``""`` inside quotes is one quote, no escape
character): a quote opens a quoted field only where a field starts (at the record's start or
after a delimiter); anywhere else it is an ordinary character. So a stray quote in an unquoted
field never swallows the records after it, and a quoted field may hold newlines.

The scanner keeps its state (:class:`State`) across buffers, so a reader can skip the middle of
an over-long record without reading it whole and still find, exactly, where the next record
starts. A record's trailing ``\\r`` (``\\r\\n`` line ends) is dropped; a lone ``\\r`` is data.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from enum import IntEnum

from tfrecordd.plugin import RawEvent

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte-order mark some tools (Excel's "CSV UTF-8") write at the start of a file."""


class State(IntEnum):
    """Where the scanner stands after the last byte it read."""

    FIELD_START = 0
    """At the start of a record or just after a delimiter: a quote here opens a quoted field."""
    UNQUOTED = 1
    """Inside an unquoted field (or after a quoted field's closing quote)."""
    QUOTED = 2
    """Inside a quoted field: newlines and delimiters are data."""
    QUOTE_IN_QUOTED = 3
    """Just after a quote inside a quoted field: a second quote is data, anything else closes."""


def record_end(buf: bytes, pos: int, state: State, delimiter: int) -> tuple[int, State]:
    """The index of the newline that ends the record going on at ``buf[pos]`` (scanned from
    ``state``), or ``-1`` if ``buf`` ends first; and the state after what was scanned."""
    n = len(buf)
    while True:
        if state is State.QUOTE_IN_QUOTED:
            if pos >= n:
                return -1, state
            if buf[pos] == 0x22:
                pos, state = pos + 1, State.QUOTED
                continue
            state = State.UNQUOTED  # the quote closed the field; buf[pos] is scanned below
        if state is State.QUOTED:
            q = buf.find(b'"', pos)
            if q < 0:
                return -1, state
            pos, state = q + 1, State.QUOTE_IN_QUOTED
            continue
        nl = buf.find(b"\n", pos)
        limit = nl if nl >= 0 else n
        q = buf.find(b'"', pos, limit)
        while q >= 0:
            if (q == pos and state is State.FIELD_START) or (q > pos and buf[q - 1] == delimiter):
                break
            q = buf.find(b'"', q + 1, limit)
        if q >= 0:
            pos, state = q + 1, State.QUOTED
            continue
        if nl >= 0:
            return nl, State.FIELD_START
        if n > pos:
            state = State.FIELD_START if buf[n - 1] == delimiter else State.UNQUOTED
        return -1, state


@dataclass(slots=True)
class Split:
    """What :func:`split` found in a buffer."""

    records: list[bytes]
    """The complete records, without their newlines."""
    ends: list[int]
    """Where the record after each one starts (just past its newline)."""
    consumed: int
    """The bytes the complete records use: the rest is the start of an unfinished record."""
    state: State
    """The scanner's state at the end of the buffer, for the unfinished record's next bytes."""


def split(buf: bytes, final: bool, state: State, delimiter: int) -> Split:
    """Complete records in ``buf``; ``state`` is the scanner's at ``buf[0]`` (not
    :attr:`State.FIELD_START` when ``buf`` continues a record whose start was skipped). At the
    end of the input (``final``), what is left is the last record."""
    n = len(buf)
    out = Split([], [], 0, state)
    pos = 0
    while pos < n:
        nl, out.state = record_end(buf, pos, out.state, delimiter)
        if nl < 0:
            if final:
                out.records.append(buf[out.consumed :])
                out.ends.append(n)
                out.consumed = n
                out.state = State.FIELD_START
            break
        out.records.append(buf[out.consumed : nl])
        out.ends.append(nl + 1)
        pos = out.consumed = nl + 1
    return out


def row(record: bytes, delimiter: str) -> list[str]:
    """A record's fields, leniently (undecodable bytes replaced): for a header row."""
    text = record.decode("utf-8", errors="replace").removesuffix("\r")
    return next(csv.reader([text], delimiter=delimiter, strict=False), [])


def event(record: bytes, where: str, header: list[str], delimiter: str) -> RawEvent:
    """A record as an event (header name → field), or as a bad event saying what is wrong."""
    try:
        text = record.decode("utf-8").removesuffix("\r")
        fields = next(csv.reader([text], delimiter=delimiter, strict=True))
    except (UnicodeDecodeError, csv.Error) as e:
        return RawEvent(record, where, error=f"not a valid CSV record: {e}")
    except StopIteration:
        return RawEvent(record, where, error="not a valid CSV record: no fields")
    if len(fields) != len(header):
        return RawEvent(
            record, where, error=f"CSV record has {len(fields)} fields, the header {len(header)}"
        )
    return RawEvent(record, where, value=dict(zip(header, fields, strict=True)), format="csv")
