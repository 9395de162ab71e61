"""CSV records in a byte stream: where each one ends, and each one as a row or a dead letter.

A record ends at a newline outside a quoted field, by the same grammar Python's :mod:`csv`
reader applies (the default dialect: ``"`` quotes, ``""`` inside quotes is one quote, no escape
character): a quote opens a quoted field only where a field starts (at the record's start or
after a delimiter); anywhere else it is an ordinary character. So a stray quote in an unquoted
field never swallows the records after it, and a quoted field may hold newlines.

The scanner keeps its state (:class:`State`) across buffers, so a reader can skip the middle of
an over-long record without reading it whole and still find, exactly, where the next record
starts. A record ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (classic Mac line ends, which
Excel's "CSV (Macintosh)" still writes), as :mod:`csv` reads them; a ``\\r`` in a quoted field
is data.
"""

from __future__ import annotations

import csv
import re
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
    AFTER_CR = 4
    """Just after a carriage return outside quotes: it ends the record, with the newline that
    follows it if one does (``\\r\\n``)."""


_SPECIAL = re.compile(rb'[\r\n"]')


def record_end(buf: bytes | bytearray, pos: int, state: State, delimiter: int) -> tuple[int, State]:
    """Where the record going on at ``buf[pos]`` (scanned from ``state``) ends: the index just
    past its line end (``\\n``, ``\\r\\n`` or a lone ``\\r`` outside quotes), or ``-1`` if
    ``buf`` ends first; and the state after what was scanned (at ``len(buf)`` when ``-1``)."""
    n = len(buf)
    while True:
        if state is State.AFTER_CR:
            if pos >= n:
                return -1, state
            return (pos + 1 if buf[pos] == 0x0A else pos), State.FIELD_START
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
        m = _SPECIAL.search(buf, pos)
        if m is None:
            if n > pos:
                state = State.FIELD_START if buf[n - 1] == delimiter else State.UNQUOTED
            return -1, state
        at = m.start()
        c = buf[at]
        if c == 0x0A:
            return at + 1, State.FIELD_START
        if c == 0x0D:
            pos, state = at + 1, State.AFTER_CR
            continue
        # A quote opens a quoted field only where a field starts; elsewhere it is text.
        opens = (at == pos and state is State.FIELD_START) or (
            at > pos and buf[at - 1] == delimiter
        )
        pos, state = at + 1, State.QUOTED if opens else State.UNQUOTED


@dataclass(slots=True)
class Split:
    """What :func:`split` found in a buffer."""

    records: list[bytes]
    """The complete records, without their line ends (but for a ``\\r`` before a newline,
    which :func:`row` and :func:`event` drop)."""
    ends: list[int]
    """Where the record after each one starts (just past its line end)."""
    consumed: int
    """The bytes the complete records use: the rest is the start of an unfinished record."""
    state: State
    """The scanner's state at the end of the buffer, for the unfinished record's next bytes."""


def split(
    buf: bytes | bytearray, final: bool, state: State, delimiter: int, scanned: int = 0
) -> Split:
    """Complete records in ``buf``, whose first record starts at ``buf[0]``. Its bytes up to
    ``scanned`` were scanned already (by the call before, on a shorter buffer), ending in
    ``state``: each byte is scanned once, however many reads a long record takes. At the end
    of the input (``final``), what is left is the last record."""
    n = len(buf)
    out = Split([], [], 0, state)
    pos = scanned
    with memoryview(buf) as view:
        while pos < n or out.state is State.AFTER_CR:
            nxt, out.state = record_end(buf, pos, out.state, delimiter)
            if nxt < 0:
                break
            # Before the newline or the lone CR (which may have been in an earlier buffer).
            end = max(nxt - 1, out.consumed)
            out.records.append(bytes(view[out.consumed : end]))
            out.ends.append(nxt)
            pos = out.consumed = nxt
        if final and out.consumed < n:
            # Unless a lone CR ends the input: it ends the last record, as anywhere else.
            end = n - 1 if out.state is State.AFTER_CR else n
            out.records.append(bytes(view[out.consumed : end]))
            out.ends.append(n)
            out.consumed = n
            out.state = State.FIELD_START
    return out


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
"""The byte-order marks of UTF-16 text (Excel's "Unicode Text", PowerShell 5.1's ``Unicode``)."""

# A record is bounded by max_line_bytes, not by the csv module's process-wide 128 KiB field
# limit, which would refuse a record the source was configured to read.
if csv.field_size_limit() < (1 << 31) - 1:
    csv.field_size_limit((1 << 31) - 1)


class BadHeader(ValueError):
    """A header row that cannot be read: the file's structure is unknown, so it is refused
    whole rather than read with the wrong columns."""


def preamble(record: bytes) -> bool:
    """Whether a record before the header is a preamble to skip: the ``#TYPE …`` line
    Windows PowerShell's ``Export-Csv`` writes without ``-NoTypeInformation``."""
    return record.startswith(b"#TYPE ")


_ENCODING_HINT = (
    '; Excel\'s "CSV (Comma delimited)" on Windows writes Windows-1252: csv_encoding = "cp1252"'
)


def header(record: bytes, delimiter: str, encoding: str = "utf-8") -> list[str]:
    """The column names of a header row; raises :class:`BadHeader` saying why there are none
    to trust (not text in ``encoding``, not one CSV record, a name given twice). A column
    without a name is named ``Unnamed: <index>``, as pandas reads the index column its
    ``to_csv`` writes."""
    if record.startswith(UTF16_BOMS):
        raise BadHeader("the file is UTF-16 text (it starts with a UTF-16 byte-order mark)")
    try:
        text = record.decode(encoding).removesuffix("\r")
    except UnicodeDecodeError as e:
        shown, hint = ("UTF-8", _ENCODING_HINT) if encoding == "utf-8" else (encoding, "")
        raise BadHeader(f"the header row is not {shown} text (byte {e.start}){hint}") from None
    if "\0" in text:
        raise BadHeader(
            "the header row holds NUL characters (UTF-16 text without a byte-order mark?)"
        )
    try:
        names = next(csv.reader([text], delimiter=delimiter, strict=True), [])
    except csv.Error as e:
        raise BadHeader(f"the header row is not a valid CSV record: {e}") from None
    seen: set[str] = set()
    for i, name in enumerate(names, 1):
        if not name:
            # As pandas names them when it reads a file it wrote with its index.
            name = names[i - 1] = f"Unnamed: {i - 1}"
        if name in seen:
            raise BadHeader(f"the header row names {name!r} twice")
        seen.add(name)
    return names


def event(
    record: bytes, where: str, header: list[str], delimiter: str, encoding: str = "utf-8"
) -> RawEvent:
    """A record as an event (header name → field), or as a bad event saying what is wrong."""
    try:
        text = record.decode(encoding).removesuffix("\r")
        fields = next(csv.reader([text], delimiter=delimiter, strict=True))
    except UnicodeDecodeError as e:
        hint = _ENCODING_HINT if encoding == "utf-8" else ""
        return RawEvent(record, where, error=f"not a valid CSV record: {e}{hint}")
    except csv.Error as e:
        return RawEvent(record, where, error=f"not a valid CSV record: {e}")
    except StopIteration:
        return RawEvent(record, where, error="not a valid CSV record: no fields")
    if len(fields) != len(header):
        return RawEvent(
            record, where, error=f"CSV record has {len(fields)} fields, the header {len(header)}"
        )
    return RawEvent(record, where, value=dict(zip(header, fields, strict=True)), format="csv")
