"""The first value of chosen features, read out of serialized ``tf.train.Example`` records
without protobuf.

What is read is what protobuf would read, for the features asked for:

- An ``Example`` may hold its ``Features`` in several fields (they are merged) and fields it
  does not declare (skipped, groups included; groups nested over 64 deep are refused).
- A key given in two map entries: the last entry wins, as in protobuf's maps (and TensorFlow's
  ``VarLenFeature``). An entry without a key has the key ``""``; within an entry, the last key
  field counts and all value fields are merged. An entry holding any other field is not an
  entry of the map (protobuf keeps it aside as an unknown field).
- A ``Feature`` whose kind is given twice keeps the last kind; lists of the same kind given in
  several fields are one list, in order.
- ``int64`` values are varints, packed or not, read as two's complement (negative values come
  back negative); ``float`` values are 32-bit, packed or not; ``bytes`` values are the bytes.

A feature that is absent, has no kind, or has an empty list reads as ``None``. A record whose
structure (the ``Example``, its ``Features``, their map entries, and the ``Feature`` and lists of
a feature asked for) is not well-formed wire format reads as ``None`` as a whole: never an
exception. Only what decides the values asked for is looked at: the ``Feature`` of a key nobody
asked for is not parsed, and a list is read up to its first value, so damage past that goes
unnoticed (the records read here were encoded or checked by the daemon already).

:class:`FeatureReader` runs in C where ``tfrecordd._cexample`` is built (:data:`COMPILED`), with
the same results, about fifteen times faster.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final, TypeAlias

from tfrecordd import speedups

__all__ = ["COMPILED", "FeatureReader", "FeatureValue", "HourGroup", "Row", "hour_groups"]

COMPILED: Final[bool] = speedups.load("_cexample") is not None
"""Whether :class:`FeatureReader` reads in C in this process."""

if COMPILED:
    from tfrecordd import _cexample

FeatureValue: TypeAlias = int | float | bytes
"""A first value: ``int`` (an ``int64_list``), ``float`` (``float_list``) or ``bytes``."""

Row: TypeAlias = tuple[FeatureValue | None, ...]
"""One record's first values, one per name asked for, in that order."""

HourGroup: TypeAlias = tuple[int, list[int], int, int]
"""Records whose time lies in one UTC hour: the hour (since the epoch), their indexes in order,
the lowest and the highest time among them."""

_BYTES, _FLOAT, _INT64 = 1, 2, 3
_MAX_DEPTH = 64
_FLOAT32 = struct.Struct("<f")


class _Malformed(Exception):
    pass


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 70:
        if i >= end:
            raise _Malformed
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, i
        shift += 7
    raise _Malformed


def _skip(buf: bytes, i: int, end: int, wire: int, number: int, depth: int) -> int:
    """Where the field whose tag ended at ``i`` ends (a group: past its end tag)."""
    if wire == 0:
        return _varint(buf, i, end)[1]
    if wire == 2:
        n, i = _varint(buf, i, end)
        i += n
    elif wire == 1 or wire == 5:
        i += 8 if wire == 1 else 4
    elif wire == 3 and depth < _MAX_DEPTH:
        while True:
            tag, i = _varint(buf, i, end)
            if tag & 7 == 4:
                if tag >> 3 != number:
                    raise _Malformed
                return i
            if tag > 0xFFFF_FFFF:  # field number 0 is let through in a group, as protobuf does
                raise _Malformed
            i = _skip(buf, i, end, tag & 7, tag >> 3, depth + 1)
    else:
        raise _Malformed
    if i > end:
        raise _Malformed
    return i


def _fields(buf: bytes, i: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire type, start, stop)`` of each field of ``buf[i:end]``; for wire type 2
    the payload is ``buf[start:stop]``, for the others ``start`` is where the value begins."""
    while i < end:
        tag, i = _varint(buf, i, end)
        number, wire = tag >> 3, tag & 7
        if number == 0 or tag > 0xFFFF_FFFF:
            raise _Malformed
        if wire == 2:
            n, start = _varint(buf, i, end)
            i = start + n
            if i > end:
                raise _Malformed
            yield number, wire, start, i
        else:
            start = i
            i = _skip(buf, i, end, wire, number, 0)
            yield number, wire, start, i


def _entries_fast(buf: bytes, wanted: dict[bytes, int]) -> dict[int, tuple[int, int]] | None:
    """The ``Feature`` span of each wanted key, for a record laid out as the daemon and protobuf
    write one (one ``Features`` field, entries of one short key then one value); ``None`` for
    any other layout, which :func:`_entries` then reads."""
    end = len(buf)
    if end == 0:
        return {}
    if end < 2 or buf[0] != 0x0A:
        return None
    n, i = buf[1], 2
    if n >= 0x80:
        try:
            n, i = _varint(buf, 1, end)
        except _Malformed:
            return None
    if i + n != end:
        return None
    spans: dict[int, tuple[int, int]] = {}
    while i < end:
        if i + 2 > end or buf[i] != 0x0A:
            return None
        n, j = buf[i + 1], i + 2
        if n >= 0x80:
            try:
                n, j = _varint(buf, i + 1, end)
            except _Malformed:
                return None
        stop = j + n
        if stop > end or j + 2 > stop or buf[j] != 0x0A or buf[j + 1] >= 0x80:
            return None
        k = j + 2 + buf[j + 1]
        if k + 2 > stop or buf[k] != 0x12:
            return None
        n, v = buf[k + 1], k + 2
        if n >= 0x80:
            try:
                n, v = _varint(buf, k + 1, stop)
            except _Malformed:
                return None
        if v + n != stop:
            return None
        index = wanted.get(buf[j + 2 : k])
        if index is not None:
            spans[index] = (v, stop)
        i = stop
    return spans


def _entries(buf: bytes, wanted: dict[bytes, int]) -> dict[int, list[tuple[int, int]]]:
    """Each wanted key's ``Feature`` spans (one per value field of its last entry), any layout."""
    found: dict[int, list[tuple[int, int]]] = {}
    for number, wire, start, stop in _fields(buf, 0, len(buf)):
        if number != 1 or wire != 2:
            continue
        for enumber, ewire, estart, estop in _fields(buf, start, stop):
            if enumber != 1 or ewire != 2:
                continue
            key, spans, unknown = b"", [], False
            for fnumber, fwire, fstart, fstop in _fields(buf, estart, estop):
                if fwire == 2 and fnumber == 1:
                    key = buf[fstart:fstop]
                elif fwire == 2 and fnumber == 2:
                    spans.append((fstart, fstop))
                else:
                    unknown = True
            index = wanted.get(key)
            if index is not None and not unknown:
                found[index] = spans
    return found


def _first(buf: bytes, spans: Sequence[tuple[int, int]]) -> FeatureValue | None:
    """The first value of the ``Feature`` merged from ``spans``."""
    kind = 0
    lists: list[tuple[int, int]] = []
    for start, stop in spans:
        for number, wire, lstart, lstop in _fields(buf, start, stop):
            if wire == 2 and 1 <= number <= 3:
                if number != kind:
                    kind, lists = number, []
                lists.append((lstart, lstop))
    for start, stop in lists:
        for number, wire, vstart, vstop in _fields(buf, start, stop):
            if number != 1:
                continue
            if kind == _INT64 and (wire == 0 or (wire == 2 and vstart < vstop)):
                value = _varint(buf, vstart, vstop)[0]
                return value - (1 << 64) if value >= 1 << 63 else value
            if kind == _BYTES and wire == 2:
                return buf[vstart:vstop]
            if kind == _FLOAT and (wire == 5 or wire == 2):
                if wire == 2 and (vstop - vstart) % 4:
                    raise _Malformed
                if vstart < vstop:
                    return float(_FLOAT32.unpack_from(buf, vstart)[0])
    return None


def _first_fast(buf: bytes, start: int, stop: int) -> FeatureValue | None:
    """:func:`_first` of one span, quicker for the layout the daemon writes: a ``Feature`` of
    one kind field whose list starts with a packed run of int64 or a bytes value."""
    i = start + 2
    if i + 2 <= stop and buf[start + 1] == stop - i and stop - i < 0x80 and buf[i] == 0x0A:
        kind, n = buf[start], buf[i + 1]
        if n < 0x80 and i + 2 + n <= stop:
            if kind == 0x1A and n:
                value = buf[i + 2]
                if value < 0x80:
                    return value
                value = _varint(buf, i + 2, i + 2 + n)[0]
                return value - (1 << 64) if value >= 1 << 63 else value
            if kind == 0x0A:
                return buf[i + 2 : i + 2 + n]
    return _first(buf, ((start, stop),))


class FeatureReader:
    """Reads the first value of each feature of ``names`` from serialized Examples (the module
    docstring says how the wire format is read)."""

    __slots__ = ("_keys", "_wanted", "names")

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names):
            raise ValueError("a feature name is given twice")
        self.names: tuple[str, ...] = tuple(names)
        """The features read, in the order of each row's values."""
        self._keys = [name.encode() for name in self.names]
        self._wanted = {key: i for i, key in enumerate(self._keys)}

    def read(self, record: bytes) -> Row | None:
        """The first value of each feature of :attr:`names` in ``record`` (``None`` where it is
        absent or empty), or ``None`` when the record is not well-formed."""
        if COMPILED:
            return _cexample.first_values((record,), self._keys)[0]
        wanted = self._wanted
        values: list[FeatureValue | None] = [None] * len(wanted)
        try:
            spans = _entries_fast(record, wanted)
            if spans is not None:
                for index, (start, stop) in spans.items():
                    values[index] = _first_fast(record, start, stop)
            else:
                for index, merged in _entries(record, wanted).items():
                    values[index] = _first(record, merged)
        except _Malformed:
            return None
        return tuple(values)

    def read_batch(self, records: Sequence[bytes]) -> list[Row | None]:
        """:meth:`read` of each record."""
        if COMPILED:
            return _cexample.first_values(records, self._keys)
        read = self.read
        return [read(record) for record in records]


def hour_groups(
    records: Sequence[bytes], name: str, per_second: int, known: bytes | None = None
) -> tuple[list[HourGroup], list[int]] | None:
    """``records`` grouped by the UTC hour of the first value of their ``int64`` feature
    ``name``, a time in ``1/per_second`` seconds, in one pass in C: the groups in order of first
    appearance, and the indexes of the records whose value is no ``int64`` (missing, of another
    kind, or the record not well-formed: :class:`FeatureReader` says which). ``None`` where
    the extension is not built (or is turned off)."""
    if not COMPILED:
        return None
    groups: tuple[list[HourGroup], list[int]] = _cexample.time_groups(
        records, name.encode(), per_second, known
    )
    return groups
