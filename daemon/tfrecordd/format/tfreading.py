"""How TensorFlow's ``tf.io.parse_example`` reads a serialized ``tf.train.Example``, next to how
protobuf reads it: the judge of the payloads the ``passthrough`` encoder cannot certify at once,
and the reader of Examples whose keys protobuf refuses
(:func:`tfrecordd.format.proto.parse_example`).

TensorFlow does not parse records with protobuf: ``parse_example``, ``parse_single_example`` and
``tf.data``'s parsing share a hand-written reader (``example_proto_fast_parsing.cc``) that is both
stricter and looser than protobuf. Stricter: a map entry must hold exactly one key and one value
(no more, no fewer: protobuf fills a missing one with its default), a ``Features`` message may
hold nothing but map entries, a group anywhere it skips fields fails, a ``Feature`` must start
with its kind, a ``BytesList`` may hold nothing but values. Looser: keys are not checked as UTF-8,
and it stops reading early, so a ``Feature`` or a value list can carry bytes it never looks at.

:func:`refusal` reads a payload both ways and accepts it only when protobuf parses it (with
``bytes`` keys), TensorFlow's reader reads every feature of it, and both read the same features
with the same values. Where the two differ, TensorFlow reads garbage or drops values silently:
a packed ``FloatList`` whose length is not a multiple of 4 (TensorFlow drops the odd bytes), a
``Feature`` holding two kinds (TensorFlow keeps the first, protobuf the last), a value list split
over several packed fields (TensorFlow reads the first), a key given twice with different values
(TensorFlow keeps the first entry, protobuf the last), an unknown field cut short (TensorFlow skips
past the end). Those are refused, each with its reason.

``passthrough`` calls it on the few payloads its compiled check flags; it is plain
Python, a few microseconds a payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = ["Reading", "WireError", "refusal"]

_BYTES, _FLOAT, _INT64 = 1, 2, 3
_KIND_NAMES = {_BYTES: "bytes_list", _FLOAT: "float_list", _INT64: "int64_list"}


class WireError(ValueError):
    """Bytes that are not a valid wire-format message of the expected type."""


@dataclass
class Reading:
    """A record as one parser reads it: each key's kind (1 bytes, 2 float, 3 int64, ``None``
    for a ``Feature`` with no kind) and values, in the order the keys first appear."""

    features: dict[bytes, tuple[int | None, tuple[object, ...]]] = field(default_factory=dict)
    unknown: bool = False
    """Whether protobuf saw a field the message does not declare, at any depth."""
    repeated: set[bytes] = field(default_factory=set)
    """The keys given in more than one entry, with different values."""


def _varint(data: bytes, i: int, end: int) -> tuple[int, int]:
    value = 0
    for k in range(10):
        if i >= end:
            raise WireError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << (7 * k)
        if not b & 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, i
    raise WireError("varint longer than 10 bytes")


def _field(data: bytes, i: int, end: int, depth: int) -> tuple[int, int, int, int, int]:
    """Protobuf's reading of the field at ``data[i]``: ``(number, wire type, start, stop,
    next)``, its value in ``data[start:stop]`` (a varint, fixed bytes, a payload or a group's
    body). Raises :class:`WireError` on anything protobuf refuses."""
    tag, i = _varint(data, i, end)
    number, wire = tag >> 3, tag & 7
    if tag > 0xFFFF_FFFF or number == 0:
        raise WireError("invalid field number")
    start = i
    if wire == 0:
        i = _varint(data, i, end)[1]
    elif wire == 1 or wire == 5:
        i += 8 if wire == 1 else 4
        if i > end:
            raise WireError("truncated fixed-size field")
    elif wire == 2:
        n, start = _varint(data, i, end)
        if n > end - start:
            raise WireError("length past the end of the message")
        i = start + n
    elif wire == 3:
        if depth >= 64:
            raise WireError("groups nested too deep")
        while True:
            if i >= end:
                raise WireError("unterminated group")
            inner, _ = _varint(data, i, end)
            if inner & 7 == 4:
                if inner >> 3 != number:
                    raise WireError("mismatched end of group")
                return number, wire, start, i, _varint(data, i, end)[1]
            i = _field(data, i, end, depth + 1)[4]
    else:
        raise WireError("unexpected end of group" if wire == 4 else f"invalid wire type {wire}")
    return number, wire, start, i, i


def _fields(data: bytes, i: int, end: int) -> list[tuple[int, int, int, int]]:
    """The fields of ``data[i:end]`` as :func:`_field` reads them."""
    out = []
    while i < end:
        number, wire, start, stop, i = _field(data, i, end, 0)
        out.append((number, wire, start, stop))
    return out


# --- protobuf's reading ---------------------------------------------------------------------


def _pb_list(data: bytes, i: int, end: int, kind: int, reading: Reading) -> list[object]:
    values: list[object] = []
    for number, wire, start, stop in _fields(data, i, end):
        if number != 1:
            reading.unknown = True
        elif kind == _BYTES and wire == 2:
            values.append(data[start:stop])
        elif kind == _FLOAT and wire == 2:
            if (stop - start) % 4:
                raise WireError("a packed float_list whose length is not a multiple of 4")
            values += struct.unpack(f"<{(stop - start) // 4}I", data[start:stop])
        elif kind == _FLOAT and wire == 5:
            values += struct.unpack("<I", data[start:stop])
        elif kind == _INT64 and wire == 2:
            j = start
            while j < stop:
                v, j = _varint(data, j, stop)
                values.append(v)
        elif kind == _INT64 and wire == 0:
            values.append(_varint(data, start, stop)[0])
        else:
            reading.unknown = True
    return values


def _pb_feature(
    data: bytes, i: int, end: int, reading: Reading, kind: int | None, values: list[object]
) -> tuple[int | None, list[object]]:
    """``(kind, values)`` of a ``Feature`` merged into the one given (a oneof: another kind
    replaces it, the same kind appends)."""
    for number, wire, start, stop in _fields(data, i, end):
        if number in _KIND_NAMES and wire == 2:
            more = _pb_list(data, start, stop, number, reading)
            if kind == number:
                values = values + more
            else:
                kind, values = number, more
        else:
            reading.unknown = True
    return kind, values


def protobuf_reading(data: bytes) -> Reading:
    """Protobuf's reading of a serialized ``Example``, keys as ``bytes`` (so a key that is not
    UTF-8 is read, where protobuf's ``string`` would refuse it). Raises :class:`WireError`."""
    reading = Reading()
    merged: dict[bytes, tuple[int | None, list[object]]] = {}
    raw_of: dict[bytes, bytes] = {}
    for number, wire, start, stop in _fields(data, 0, len(data)):
        if number != 1 or wire != 2:
            reading.unknown = True
            continue
        for enumber, ewire, estart, estop in _fields(data, start, stop):
            if enumber != 1 or ewire != 2:
                reading.unknown = True
                continue
            key = b""
            kind: int | None = None
            values: list[object] = []
            raw = []
            for fnumber, fwire, fstart, fstop in _fields(data, estart, estop):
                if fnumber == 1 and fwire == 2:
                    key = data[fstart:fstop]
                elif fnumber == 2 and fwire == 2:
                    kind, values = _pb_feature(data, fstart, fstop, reading, kind, values)
                    raw.append(data[fstart:fstop])
                else:
                    reading.unknown = True
            joined = b"".join(raw)
            if raw_of.setdefault(key, joined) != joined:
                reading.repeated.add(key)
            merged.pop(key, None)  # a repeated key replaces the earlier entry
            merged[key] = (kind, values)
    reading.features = {k: (kind, tuple(v)) for k, (kind, v) in merged.items()}
    return reading


# --- TensorFlow's reading (of bytes protobuf parses) ----------------------------------------


class _TfRefuses(Exception):
    pass


def _tf_list(data: bytes, i: int, end: int, kind: int) -> list[object]:
    """TensorFlow's reading of a value list: a packed field and nothing after it is looked at,
    or unpacked values and nothing else."""
    if i == end:
        return []
    first = data[i]
    if kind == _BYTES:
        values: list[object] = []
        while i < end:
            if data[i] != 0x0A:
                raise _TfRefuses("a bytes_list holds a field other than its values")
            n, i = _varint(data, i + 1, end)
            values.append(data[i : i + n])
            i += n
        return values
    if first == 0x0A:  # packed: this field only
        n, i = _varint(data, i + 1, end)
        if kind == _FLOAT:
            return list(struct.unpack(f"<{n // 4}I", data[i : i + n // 4 * 4]))
        values = []
        stop = i + n
        while i < stop:
            v, i = _varint(data, i, stop)
            values.append(v)
        return values
    if kind == _FLOAT and first == 0x0D:
        values = []
        while i < end:
            if data[i] != 0x0D or end - i < 5:
                raise _TfRefuses("a float_list mixes unpacked values with other fields")
            values += struct.unpack("<I", data[i + 1 : i + 5])
            i += 5
        return values
    if kind == _INT64 and first == 0x08:
        values = []
        while i < end:
            if data[i] != 0x08:
                raise _TfRefuses("an int64_list mixes unpacked values with other fields")
            v, i = _varint(data, i + 1, end)
            values.append(v)
        return values
    raise _TfRefuses(f"a {_KIND_NAMES[kind]} starts with a field other than its values")


def _tf_feature(data: bytes, i: int, end: int) -> tuple[int | None, tuple[object, ...]]:
    if i == end:
        return None, ()
    kind = {0x0A: _BYTES, 0x12: _FLOAT, 0x1A: _INT64}.get(data[i])
    if kind is None:
        raise _TfRefuses("a Feature that does not start with its kind")
    n, i = _varint(data, i + 1, end)
    return kind, tuple(_tf_list(data, i, i + n, kind))


def _tf_entry(data: bytes, i: int, end: int) -> tuple[bytes, int, int]:
    """The key and the span of the ``Feature`` of one map entry; exactly two fields."""
    key: bytes | None = None
    value: tuple[int, int] | None = None
    for _ in range(2):
        if i >= end:
            raise _TfRefuses("a feature map entry without a key or without a value")
        tag, i = _varint(data, i, end)
        if tag not in (0x0A, 0x12):
            raise _TfRefuses("a feature map entry with a field other than its key and value")
        n, i = _varint(data, i, end)
        if tag == 0x0A:
            key = data[i : i + n]
        else:
            value = (i, i + n)
        i += n
    if i != end:
        raise _TfRefuses("a feature map entry with more than a key and a value")
    if key is None or value is None:
        raise _TfRefuses("a feature map entry without a key or without a value")
    return key, value[0], value[1]


def tensorflow_reading(data: bytes) -> dict[bytes, tuple[int | None, tuple[object, ...]]]:
    """What ``tf.io.parse_example`` reads from bytes protobuf parses, every key named in the
    spec: each key's kind and values (the last entry of a repeated key, as a ``VarLenFeature``
    reads it). Raises :class:`_TfRefuses` where it fails."""
    entries: dict[bytes, tuple[int, int]] = {}
    i, end = 0, len(data)
    while i < end:
        if data[i] == 0x0A:
            n, i = _varint(data, i + 1, end)
            stop = i + n
            while i < stop:
                if data[i] != 0x0A:
                    raise _TfRefuses("a Features message holds a field other than its entries")
                n, i = _varint(data, i + 1, stop)
                key, fstart, fstop = _tf_entry(data, i, i + n)
                entries[key] = (fstart, fstop)
                i += n
            continue
        tag, i = _varint(data, i, end)
        wire = tag & 7
        if wire in (3, 4):
            raise _TfRefuses("a group among the fields of an Example")
        if wire == 0:
            _, i = _varint(data, i, end)
        elif wire == 2:
            n, i = _varint(data, i, end)
            i += n
        else:
            i += 8 if wire == 1 else 4
    return {key: _tf_feature(data, s, e) for key, (s, e) in entries.items()}


def _described(kind: int | None, values: tuple[object, ...]) -> str:
    if kind is None:
        return "absent or of no kind"
    name = _KIND_NAMES[kind]
    article = "an" if name[0] == "i" else "a"
    return f"{article} {name} of {len(values)} value{'' if len(values) == 1 else 's'}"


def refusal(data: bytes | bytearray | memoryview, strict: bool) -> str | None:
    """Why a payload is refused as an ``Example``, or ``None``.

    Refused: what ``tf.io.parse_example`` fails on, what protobuf does not parse, and what the
    two read differently (module docstring). With ``strict``, also a field the message does not
    declare (at any depth) and a key that is not UTF-8 (which protobuf's ``string`` refuses).
    """
    data = bytes(data)
    try:
        pb = protobuf_reading(data)
    except WireError as e:
        return f"not an Example: {e}"
    try:
        tf = tensorflow_reading(data)
    except _TfRefuses as e:
        return f"not an Example TensorFlow reads: {e}"
    if pb.repeated:
        # A FixedLenFeature may read another of the entries than a VarLenFeature does.
        key = min(pb.repeated)
        return (
            f"an Example that gives feature {key.decode(errors='backslashreplace')!r} twice, "
            "with different values (TensorFlow's parsers do not agree on which one they read)"
        )
    for key, (pkind, pvalues) in pb.features.items():
        kind, values = tf.get(key, (None, ()))
        if (pkind, pvalues) != (kind, values):
            return (
                "an Example that TensorFlow and protobuf read differently: feature "
                f"{key.decode(errors='backslashreplace')!r} is {_described(kind, values)} to "
                f"TensorFlow, {_described(pkind, pvalues)} to protobuf (a Feature with two "
                "kinds, a value list in several fields...)"
            )
    if strict:
        if pb.unknown:
            return (
                "not an Example: it parses, but holds fields that message does not have "
                "(another message type, or damaged bytes)"
            )
        for key in pb.features:
            try:
                key.decode()
            except UnicodeDecodeError:
                return (
                    f"not an Example: feature key {key.decode(errors='backslashreplace')!r} is "
                    'not UTF-8 (unknown_fields = "keep" accepts it)'
                )
    return None
