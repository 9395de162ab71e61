"""The feature reader (tfrecordd.format.features), held to protobuf's reading of the same bytes."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecordd.format import proto
from tfrecordd.format.features import FeatureReader, FeatureValue, Row
from tfrecordd.format.wire import ExampleWriter, FeatureType

FEATURES: Mapping[str, FeatureType] = {
    "ts": FeatureType.INT64,
    "when": FeatureType.BYTES,
    "country": FeatureType.BYTES,
    "n": FeatureType.INT64,
    "score": FeatureType.FLOAT,
}
WRITER = ExampleWriter(list(FEATURES.items()))


def record(**values: Any) -> bytes:
    return WRITER.encode([values.get(name) for name in FEATURES])


# --- the feature reader, against protobuf ---------------------------------------------------

NAMES = ["a", "b", "ts", "k" * 130, ""]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    head = _varint(number << 3 | wire)
    return head + (_varint(len(payload)) + payload if wire == 2 else payload)


_UNKNOWN = st.sampled_from(
    [
        _field(9, 0, _varint(300)),
        _field(9, 1, b"\x01" * 8),
        _field(9, 5, b"\x02" * 4),
        _field(9, 2, b"zz"),
        _field(9, 3, _field(1, 0, b"\x05") + _varint(9 << 3 | 4)),
        _field(1, 0, b"\x07"),  # a known number with another wire type: unknown
    ]
)


@st.composite
def _list(draw: st.DrawFn, kind: int) -> bytes:
    """A value list's payload in any encoding protobuf reads, sometimes with unknown fields."""
    if kind == 1:
        values = draw(st.lists(st.binary(max_size=140), max_size=3))
        parts = [_field(1, 2, v) for v in values]
    elif kind == 2:
        floats = draw(st.lists(st.floats(width=32), max_size=3))
        packed = b"".join(struct.pack("<f", f) for f in floats)
        unpacked = [_field(1, 5, struct.pack("<f", f)) for f in floats]
        parts = [_field(1, 2, packed)] if draw(st.booleans()) else unpacked
    else:
        ints = draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
        packed = b"".join(_varint(v) for v in ints)
        unpacked = [_field(1, 0, _varint(v)) for v in ints]
        parts = [_field(1, 2, packed)] if draw(st.booleans()) else unpacked
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(_UNKNOWN))
    return b"".join(parts)


@st.composite
def _feature(draw: st.DrawFn) -> bytes:
    """A Feature's payload: no kind, one kind, a kind given twice, or two kinds."""
    kinds = draw(st.lists(st.integers(1, 3), max_size=3))
    parts = [_field(kind, 2, draw(_list(kind))) for kind in kinds]
    if draw(st.booleans()):
        parts.append(draw(_UNKNOWN))
    return b"".join(parts)


@st.composite
def example_bytes(draw: st.DrawFn) -> bytes:
    """A serialized Example: entries in any order, keys repeated, values split over fields, key
    after value, Features given twice, unknown fields at every level."""
    entries = []
    for _ in range(draw(st.integers(0, 6))):
        key = _field(1, 2, draw(st.sampled_from([*NAMES, "other"])).encode())
        values = [_field(2, 2, draw(_feature())) for _ in range(draw(st.integers(0, 2)))]
        parts = [key, *values] if draw(st.booleans()) else [*values, key]
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(_UNKNOWN))
        entries.append(_field(1, 2, b"".join(parts)))
    cut = draw(st.integers(0, len(entries)))
    groups = [entries[:cut], entries[cut:]] if draw(st.booleans()) else [entries]
    parts = [_field(1, 2, b"".join(g)) for g in groups]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(_UNKNOWN))
    return b"".join(parts)


def oracle(data: bytes, names: list[str]) -> Row | None:
    """Protobuf's reading: each name's first value, or None for a record it refuses."""
    message: Any = proto.Example()
    try:
        message.ParseFromString(data)
    except Exception:
        return None
    got: list[FeatureValue | None] = []
    for name in names:
        values = (
            proto.feature_values(message.features.feature[name])
            if name in message.features.feature
            else []
        )
        got.append(values[0] if values else None)
    return tuple(got)


def _bits(value: FeatureValue | None) -> object:
    return struct.pack("<f", value) if isinstance(value, float) else value


def same(a: Row | None, b: Row | None) -> bool:
    """Equal, a float NaN equal to a NaN of the same bits."""
    if a is None or b is None:
        return a is b
    return [_bits(v) for v in a] == [_bits(v) for v in b]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(example_bytes(), st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
def test_reader_reads_what_protobuf_reads(data: bytes, names: list[str]) -> None:
    expected = oracle(data, names)
    assert expected is not None
    got = FeatureReader(names).read(data)
    assert same(got, expected), (got, expected)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(example_bytes(), st.data())
def test_reader_never_raises_and_agrees_wherever_protobuf_parses(
    data: bytes, draw: st.DataObject
) -> None:
    mutated = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        op = draw.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw.draw(st.integers(0, len(mutated)))
        if op == "flip" and at < len(mutated):
            mutated[at] ^= draw.draw(st.integers(1, 255))
        elif op == "cut":
            del mutated[at:]
        else:
            mutated[at:at] = draw.draw(st.binary(min_size=1, max_size=3))
    names = ["a", "ts", "k" * 130]
    got = FeatureReader(names).read(bytes(mutated))
    expected = oracle(bytes(mutated), names)
    if expected is not None:
        assert same(got, expected), (got, expected)


def test_reader_on_the_writer_s_records_and_odd_bytes() -> None:
    reader = FeatureReader(["ts", "country", "score", "n"])
    data = record(ts=[-5, 7], country=[b"", b"x"], score=[0.5], n=[2**63 - 1])
    assert reader.read(data) == (-5, b"", 0.5, 2**63 - 1)
    assert reader.read(b"") == (None, None, None, None)
    assert reader.read(record(n=[])) == (None, None, None, None)
    for bad in [b"\x0a", b"\x0a\x80", b"\x00\x00", b"\x0b", b"\x0a\x02\x0a\x05", b"\xff" * 11]:
        assert reader.read(bad) is None, bad
    assert reader.read_batch([data, b"\x0a"]) == [reader.read(data), None]
    with pytest.raises(ValueError, match="twice"):
        FeatureReader(["a", "a"])
