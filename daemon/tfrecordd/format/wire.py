"""The ``tf.train.Example`` / ``SequenceExample`` wire format, written directly from a plan.

A writer is compiled once from the feature names and types: every key and tag is turned into
bytes ahead of time, so encoding an event is a few ``struct.pack`` calls, varints from a table and
one ``b"".join``. No protobuf message is built on this path; :mod:`tfrecordd.format.proto` is the
oracle that the tests hold these bytes against.

Map entries are written in the order of their keys' UTF-8 bytes (as protobuf's C++ deterministic
serialization orders them), whatever the declaration order; each entry equals protobuf's own
serialization of it byte for byte.

Values are checked, never wrapped or truncated: an int64 outside ``[-2**63, 2**63)``, a finite
float that does not fit a float32, or a value of the wrong Python type (``bool`` included) raises
:class:`~tfrecordd.errors.EncodeError` naming the feature. NaN and infinities given as such are
written as such.
"""

from __future__ import annotations

import contextlib
import reprlib
import struct
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from tfrecordd.errors import EncodeError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "BytesEntryHead",
    "ExampleWriter",
    "FeatureType",
    "SequenceExampleWriter",
    "clipped",
    "describe",
    "example_head",
    "map_entries",
    "varint",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_MASK64 = 2**64 - 1


class FeatureType(StrEnum):
    """The three kinds of value list a ``tf.train.Feature`` holds."""

    INT64 = "int64"
    FLOAT = "float"
    BYTES = "bytes"


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_LIMIT = 1 << 14
_SMALL: tuple[bytes, ...] = tuple(_varint_slow(n) for n in range(_SMALL_LIMIT))
"""Every one- and two-byte varint: lengths and small ints are looked up, not computed."""


def varint(n: int) -> bytes:
    """The varint of a non-negative ``n``."""
    return _SMALL[n] if n < _SMALL_LIMIT else _varint_slow(n)


_varint = varint


def example_head(n: int) -> bytes:
    """What precedes ``n`` bytes of ``feature`` map entries in a serialized ``Example`` (its
    ``features`` field's tag and length): the inverse of :func:`map_entries`."""
    return b"\x0a" + varint(n)


def map_entries(example: bytes) -> bytes:
    """The ``feature`` map entries of a serialized ``Example`` that has any: what follows its
    ``features`` field's tag and length (the way to splice one writer's entries into a record)."""
    i = 1
    while example[i] & 0x80:
        i += 1
    return example[i + 1 :]


_FLOAT_PACKERS: tuple[Callable[..., bytes], ...] = tuple(
    struct.Struct(f"<{n}f").pack for n in range(65)
)


_HUGE_INT_BITS = 4000
"""Beyond this, ``repr`` of an int may raise (the limit on int-to-text digits): give its size."""

_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxother = 40


def clipped(value: Any) -> str:
    """The repr of ``value``, cut to 40 characters: error reasons stay short whatever the input.

    Never raises: an int too long to print, a list nested too deep for ``repr`` or an object
    whose ``repr`` fails is shown by an abridged form or by its type.
    """
    if isinstance(value, int) and value.bit_length() > _HUGE_INT_BITS:
        return f"<{'-' if value < 0 else ''}int of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
        if isinstance(value, list | tuple | dict):
            with contextlib.suppress(Exception):
                text = _SHORT_REPR.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe(value: Any) -> str:
    """An offending value as an error reason shows it: its type and a clipped repr."""
    kind = "float" if isinstance(value, float) else type(value).__name__
    return f"{kind} {clipped(value)}"


def _int64_error(values: Sequence[Any]) -> EncodeError:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            return EncodeError(f"expected int64, got {describe(v)}")
        if not INT64_MIN <= v <= INT64_MAX:
            return EncodeError(f"int64 out of range: {clipped(v)}")
    return EncodeError("expected a list of int64")


def _float_error(values: Sequence[Any]) -> EncodeError:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return EncodeError(f"expected float, got {describe(v)}")
        try:
            struct.pack("<f", v)
        except (OverflowError, struct.error):
            return EncodeError(f"float out of float32 range: {clipped(v)}")
    return EncodeError("expected a list of float")


def _bytes_error(values: Sequence[Any]) -> EncodeError:
    for v in values:
        if not isinstance(v, str | bytes):
            return EncodeError(f"expected bytes, got {describe(v)}")
        if isinstance(v, str):
            try:
                v.encode()
            except UnicodeEncodeError as e:
                return EncodeError(f"string is not valid UTF-8: {e.reason} at {e.start}")
    return EncodeError("expected a list of bytes")


def _int64_payload(values: Sequence[Any]) -> bytes:
    """The packed varints of an ``Int64List``; negative values take ten bytes."""
    if len(values) == 1:
        v = values[0]
        if v.__class__ is int and 0 <= v < _SMALL_LIMIT:
            return _SMALL[v]
    parts = []
    small = _SMALL
    try:
        for v in values:
            if v.__class__ is not int:
                raise TypeError
            if 0 <= v < _SMALL_LIMIT:
                parts.append(small[v])
            elif INT64_MIN <= v <= INT64_MAX:
                parts.append(_varint_slow(v & _MASK64))
            else:
                raise OverflowError
    except (TypeError, AttributeError, OverflowError):
        # Subclasses of int other than bool (IntEnum, numpy-like ints) are ints too.
        if not any(v.__class__ is bool or not isinstance(v, int) for v in values) and all(
            INT64_MIN <= v <= INT64_MAX for v in values
        ):
            return _int64_payload([int(v) for v in values])
        raise _int64_error(values) from None
    return b"".join(parts)


_PACK_ONE_FLOAT = _FLOAT_PACKERS[1]


def _float_payload(values: Sequence[Any]) -> bytes:
    """The packed little-endian float32 values of a ``FloatList``."""
    n = len(values)
    try:
        if n == 1 and values[0].__class__ is float:
            return _PACK_ONE_FLOAT(values[0])
        if bool in map(type, values):
            raise TypeError
        return _FLOAT_PACKERS[n](*values) if n <= 64 else struct.pack(f"<{n}f", *values)
    except (struct.error, OverflowError, TypeError):
        raise _float_error(values) from None


def _bytes_payload(values: Sequence[Any]) -> bytes:
    """The fields of a ``BytesList``; ``str`` values are written as UTF-8."""
    parts = []
    try:
        for v in values:
            if v.__class__ is str:
                v = v.encode()
            elif v.__class__ is not bytes:
                raise TypeError
            n = len(v)
            parts.append(b"\x0a")
            parts.append(_SMALL[n] if n < _SMALL_LIMIT else _varint_slow(n))
            parts.append(v)
    except (TypeError, UnicodeEncodeError):
        raise _bytes_error(values) from None
    return b"".join(parts)


_PAYLOAD: dict[FeatureType, tuple[bytes, bool, Callable[[Sequence[Any]], bytes]]] = {
    FeatureType.BYTES: (b"\x0a", False, _bytes_payload),
    FeatureType.FLOAT: (b"\x12", True, _float_payload),
    FeatureType.INT64: (b"\x1a", True, _int64_payload),
}
"""Per type: the ``Feature`` field tag, whether the payload is one packed field, the encoder."""

_HEADS_CACHED = 1024


def _feature_head(kind_tag: bytes, packed: bool, n: int) -> bytes:
    """The bytes of a ``Feature`` that precede a payload of ``n`` bytes."""
    value_head = b"\x0a" + _varint(n) if packed and n else b""
    return kind_tag + _varint(len(value_head) + n) + value_head


class _Heads(dict[int, bytes]):
    """Everything of one map entry that precedes a payload of a given length, cached by length.

    An entry is ``key field, Feature{kind tag, length, [packed tag, length,] payload}``: all of
    it but the payload depends only on the feature and the payload's length.
    """

    def __init__(self, key: bytes, kind_tag: bytes, packed: bool) -> None:
        super().__init__()
        self.key_field = b"\x0a" + _varint(len(key)) + key
        self.kind_tag = kind_tag
        self.packed = packed

    def __missing__(self, n: int) -> bytes:
        feature_head = _feature_head(self.kind_tag, self.packed, n)
        value = b"\x12" + _varint(len(feature_head) + n) + feature_head
        entry_len = len(self.key_field) + len(value) + n
        head = b"\x0a" + _varint(entry_len) + self.key_field + value
        if n < _HEADS_CACHED:
            self[n] = head
        return head


class _StepHeads(_Heads):
    """Like :class:`_Heads`, for one step of a ``FeatureList``: a repeated ``Feature`` field."""

    def __missing__(self, n: int) -> bytes:
        feature_head = _feature_head(self.kind_tag, self.packed, n)
        head = b"\x0a" + _varint(len(feature_head) + n) + feature_head
        if n < _HEADS_CACHED:
            self[n] = head
        return head


class BytesEntryHead:
    """Everything of the map entry of a one-value bytes feature ``key`` that precedes the value's
    ``n`` bytes (``head(n) + value`` is the entry :class:`ExampleWriter` writes): lets a caller
    splice a large value into a record without copying it into a list first."""

    __slots__ = ("_heads",)

    def __init__(self, key: str) -> None:
        kind_tag, packed, _ = _PAYLOAD[FeatureType.BYTES]
        self._heads = _Heads(key.encode(), kind_tag, packed)

    def __call__(self, n: int) -> bytes:
        value = _varint(n)
        return self._heads[1 + len(value) + n] + b"\x0a" + value


def _compile(
    features: Sequence[tuple[str, FeatureType]], heads: type[_Heads] = _Heads
) -> tuple[tuple[int, str, _Heads, Callable[[Sequence[Any]], bytes]], ...]:
    """(index into the values, name, the entry heads, the payload encoder) for each feature.

    Sorted by the key's UTF-8 bytes, so the output does not depend on the declaration order.
    """
    seen: set[str] = set()
    plan = []
    for index, (name, kind) in enumerate(features):
        if name in seen:
            raise ValueError(f"feature {name!r} is declared twice")
        seen.add(name)
        key = name.encode()
        kind_tag, packed, payload = _PAYLOAD[FeatureType(kind)]
        plan.append((key, index, name, heads(key, kind_tag, packed), payload))
    plan.sort(key=lambda p: p[0])
    return tuple((index, name, heads, payload) for _, index, name, heads, payload in plan)


def _check_count(values: Sequence[Any], expected: int, what: str) -> None:
    if len(values) != expected:
        raise EncodeError(f"expected {expected} {what} values, got {len(values)}")


def _check_list(value: Any) -> None:
    """Refuse what is not a list of values; a ``str`` would otherwise be split into characters."""
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Sequence):
        raise EncodeError(f"expected a list of values, got {describe(value)}")


class ExampleWriter:
    """Writes serialized ``tf.train.Example`` messages for a fixed list of features.

    ``features`` are ``(name, type)`` pairs; :meth:`encode` takes the values in the same order.
    """

    __slots__ = ("_count", "_plan")

    def __init__(self, features: Sequence[tuple[str, FeatureType]]) -> None:
        self._plan = _compile(features)
        self._count = len(self._plan)

    def encode(self, values: Sequence[Sequence[Any] | None]) -> bytes:
        """Serialize one ``Example``.

        ``values[i]`` is the list for the i-th feature: ints for int64, floats (or ints) for
        float, ``bytes`` or ``str`` (written as UTF-8) for bytes. ``None`` leaves the feature out;
        an empty list writes it with an empty value list of its kind.

        Raises :class:`~tfrecordd.errors.EncodeError` naming the feature on a value that cannot be
        written exactly.
        """
        if len(values) != self._count:
            _check_count(values, self._count, "feature")
        parts: list[bytes] = []
        name = None
        try:
            for index, name, heads, payload in self._plan:  # noqa: B007
                v = values[index]
                if v is None:
                    continue
                if v.__class__ is not list:
                    _check_list(v)
                data = payload(v)
                parts.append(heads[len(data)])
                parts.append(data)
        except EncodeError as e:
            raise EncodeError(e.reason, name) from None
        body = b"".join(parts)
        n = len(body)
        return b"\x0a" + (_SMALL[n] if n < _SMALL_LIMIT else _varint_slow(n)) + body


def _feature_list_entry(
    name: str, heads: _Heads, payload: Callable[[Sequence[Any]], bytes], steps: Sequence[Any]
) -> bytes:
    """The ``FeatureLists`` map entry of one feature list: one ``Feature`` per step."""
    if steps.__class__ is not list:
        try:
            _check_list(steps)
        except EncodeError:
            raise EncodeError(f"expected a list of steps, got {describe(steps)}", name) from None
    parts = []
    try:
        for step in steps:
            if step.__class__ is not list:
                _check_list(step)
            data = payload(step)
            parts.append(heads[len(data)])
            parts.append(data)
    except EncodeError as e:
        raise EncodeError(f"step {len(parts) // 2}: {e.reason}", name) from None
    body = b"".join(parts)
    value = b"\x12" + _varint(len(body))
    entry_len = len(heads.key_field) + len(value) + len(body)
    return b"".join((b"\x0a", _varint(entry_len), heads.key_field, value, body))


class SequenceExampleWriter:
    """Writes serialized ``tf.train.SequenceExample`` messages.

    ``context`` declares the per-sequence features, ``feature_lists`` the per-step ones, both as
    ``(name, type)`` pairs in the order :meth:`encode` takes their values.
    """

    __slots__ = ("_context", "_context_count", "_lists", "_lists_count")

    def __init__(
        self,
        context: Sequence[tuple[str, FeatureType]],
        feature_lists: Sequence[tuple[str, FeatureType]],
    ) -> None:
        self._context = ExampleWriter(context)
        self._lists = _compile(feature_lists, _StepHeads)
        self._lists_count = len(self._lists)

    def encode(
        self,
        context_values: Sequence[Sequence[Any] | None],
        list_values: Sequence[Sequence[Sequence[Any]] | None],
    ) -> bytes:
        """Serialize one ``SequenceExample``.

        ``context_values`` are as in :meth:`ExampleWriter.encode`. ``list_values[i]`` is the
        i-th feature list as a list of steps, each step a list of values; ``None`` leaves the
        feature list out, an empty list writes it with no steps.
        """
        if len(list_values) != self._lists_count:
            _check_count(list_values, self._lists_count, "feature list")
        context = self._context.encode(context_values)
        parts = []
        for index, name, heads, payload in self._lists:
            steps = list_values[index]
            if steps is not None:
                parts.append(_feature_list_entry(name, heads, payload, steps))
        entries = b"".join(parts)
        return b"".join((context, b"\x12", _varint(len(entries)), entries))
