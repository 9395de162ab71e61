"""The wire writers against protobuf itself: same messages, same bytes, no silent coercion."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.errors import EncodeError
from tfrecordd.format import proto
from tfrecordd.format.wire import (
    ExampleWriter,
    FeatureType,
    SequenceExampleWriter,
    clipped,
    describe,
)

FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

int64s = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(
    [INT64_MIN, INT64_MAX, -1, 0, 127, 128]
)
float32_safe = st.floats(min_value=-FLT_MAX, max_value=FLT_MAX) | st.sampled_from(
    [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e-45, 1.4e-45, FLT_MAX, 1 / 3]
)
byte_values = st.binary() | st.text() | st.sampled_from(["\x00", "\U0001f600", "a\x00\U00010000"])
VALUES = {
    FeatureType.INT64: st.lists(int64s, max_size=8),
    FeatureType.FLOAT: st.lists(float32_safe, max_size=8),
    FeatureType.BYTES: st.lists(byte_values, max_size=8),
}
feature_types = st.sampled_from(list(FeatureType))


@st.composite
def declared(draw: st.DrawFn, max_size: int = 12) -> list[tuple[str, FeatureType]]:
    names = draw(st.lists(st.text(), unique=True, max_size=max_size))
    return [(name, draw(feature_types)) for name in names]


@st.composite
def example_case(draw: st.DrawFn) -> tuple[list[tuple[str, FeatureType]], list[Any]]:
    features = draw(declared())
    values = [draw(st.none() | VALUES[kind]) for _, kind in features]
    return features, values


@st.composite
def sequence_case(
    draw: st.DrawFn,
) -> tuple[list[tuple[str, FeatureType]], list[Any], list[tuple[str, FeatureType]], list[Any]]:
    context = draw(declared(max_size=5))
    lists = draw(declared(max_size=5))
    context_values = [draw(st.none() | VALUES[kind]) for _, kind in context]
    list_values = [draw(st.none() | st.lists(VALUES[kind], max_size=5)) for _, kind in lists]
    return context, context_values, lists, list_values


def as_float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def intended(kind: FeatureType, values: list[Any]) -> tuple[str, list[Any]]:
    """What a reader must find for ``values``: the kind and the values as protobuf holds them."""
    if kind is FeatureType.INT64:
        return "int64_list", list(values)
    if kind is FeatureType.FLOAT:
        return "float_list", [comparable(as_float32(v)) for v in values]
    return "bytes_list", [v.encode() if isinstance(v, str) else v for v in values]


def comparable(value: float) -> Any:
    """NaN never equals itself; compare it as a marker, and keep the sign of zeros."""
    if math.isnan(value):
        return "nan"
    return (value, math.copysign(1.0, value))


def found(feature: Any) -> tuple[str | None, list[Any]]:
    kind = feature.WhichOneof("kind")
    if kind is None:
        return None, []
    values = list(getattr(feature, kind).value)
    if kind == "float_list":
        values = [comparable(v) for v in values]
    return kind, values


def fill(feature: Any, kind: FeatureType, values: list[Any]) -> None:
    field, _ = intended(kind, values)
    target = getattr(feature, field)
    target.SetInParent()
    if kind is FeatureType.BYTES:
        target.value.extend(v.encode() if isinstance(v, str) else v for v in values)
    else:
        target.value.extend(values)


def oracle_example(features: list[tuple[str, FeatureType]], values: list[Any]) -> Any:
    msg: Any = proto.Example()
    msg.features.SetInParent()
    for (name, kind), v in zip(features, values, strict=True):
        if v is not None:
            fill(msg.features.feature[name], kind, v)
    return msg


@given(example_case())
def test_example_parses_to_the_intended_features(case: Any) -> None:
    features, values = case
    msg: Any = proto.Example.FromString(ExampleWriter(features).encode(values))
    expected = {
        name: intended(kind, v)
        for (name, kind), v in zip(features, values, strict=True)
        if v is not None
    }
    assert {name: found(f) for name, f in msg.features.feature.items()} == expected


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if byte < 0x80:
            return value, at


def map_entries(data: bytes) -> list[bytes]:
    """The serialized map entries of an Example's ``Features``, in the order written."""
    assert data[0] == 0x0A
    size, at = read_varint(data, 1)
    assert at + size == len(data)
    entries = []
    while at < len(data):
        assert data[at] == 0x0A
        size, start = read_varint(data, at + 1)
        entries.append(data[at : start + size])
        at = start + size
    return entries


@given(example_case())
def test_example_entries_equal_protobuf_serialization_byte_for_byte(case: Any) -> None:
    # Map order in deterministic output differs between protobuf backends (upb puts "ab" before
    # "a"), so the entries are compared as a set; with one feature, see the test below.
    features, values = case
    ours = ExampleWriter(features).encode(values)
    theirs = oracle_example(features, values).SerializeToString(deterministic=True)
    assert len(ours) == len(theirs)
    assert sorted(map_entries(ours)) == sorted(map_entries(theirs))


@given(feature_types.flatmap(lambda k: st.tuples(st.just(k), st.text(), VALUES[k])))
def test_one_feature_bytes_equal_protobuf(case: tuple[FeatureType, str, list[Any]]) -> None:
    kind, name, values = case
    ours = ExampleWriter([(name, kind)]).encode([values])
    assert ours == oracle_example([(name, kind)], [values]).SerializeToString(deterministic=True)


def test_empty_list_keeps_its_kind_and_none_leaves_the_feature_out() -> None:
    writer = ExampleWriter(
        [("i", FeatureType.INT64), ("f", FeatureType.FLOAT), ("b", FeatureType.BYTES)]
    )
    msg: Any = proto.Example.FromString(writer.encode([[], [], None]))
    assert {name: found(f) for name, f in msg.features.feature.items()} == {
        "i": ("int64_list", []),
        "f": ("float_list", []),
    }


@given(sequence_case())
def test_sequence_example_parses_to_the_intended_message(case: Any) -> None:
    context, context_values, lists, list_values = case
    data = SequenceExampleWriter(context, lists).encode(context_values, list_values)
    msg: Any = proto.SequenceExample.FromString(data)
    assert {name: found(f) for name, f in msg.context.feature.items()} == {
        name: intended(kind, v)
        for (name, kind), v in zip(context, context_values, strict=True)
        if v is not None
    }
    assert {
        name: [found(f) for f in fl.feature] for name, fl in msg.feature_lists.feature_list.items()
    } == {
        name: [intended(kind, step) for step in steps]
        for (name, kind), steps in zip(lists, list_values, strict=True)
        if steps is not None
    }

    oracle: Any = proto.SequenceExample()
    oracle.context.SetInParent()
    oracle.feature_lists.SetInParent()
    for (name, kind), v in zip(context, context_values, strict=True):
        if v is not None:
            fill(oracle.context.feature[name], kind, v)
    for (name, kind), steps in zip(lists, list_values, strict=True):
        if steps is not None:
            feature_list = oracle.feature_lists.feature_list[name]
            feature_list.SetInParent()
            for step in steps:
                fill(feature_list.feature.add(), kind, step)
    assert len(data) == len(oracle.SerializeToString(deterministic=True))


def encode_one(kind: FeatureType, values: Any, name: str = "feat") -> bytes:
    return ExampleWriter([("other", FeatureType.INT64), (name, kind)]).encode([[1], values])


@given(st.integers(max_value=INT64_MIN - 1) | st.integers(min_value=INT64_MAX + 1), st.text())
def test_int64_out_of_range_is_refused_naming_the_feature(value: int, name: str) -> None:
    with pytest.raises(EncodeError, match="out of range") as info:
        encode_one(FeatureType.INT64, [1, value], name)
    assert info.value.feature == name


@given(
    st.floats(min_value=3.5e38, allow_infinity=False)
    | st.floats(max_value=-3.5e38, allow_infinity=False)
)
def test_finite_float_beyond_float32_is_refused_not_made_infinite(value: float) -> None:
    with pytest.raises(EncodeError, match="float32 range") as info:
        encode_one(FeatureType.FLOAT, [0.5, value])
    assert info.value.feature == "feat"


def test_float_rounding_to_float32_max_is_accepted() -> None:
    just_above = FLT_MAX * (1 + 2**-26)
    msg: Any = proto.Example.FromString(encode_one(FeatureType.FLOAT, [just_above]))
    assert list(msg.features.feature["feat"].float_list.value) == [FLT_MAX]


@pytest.mark.parametrize(
    ("kind", "values", "reason"),
    [
        (FeatureType.INT64, [True], "expected int64, got bool True"),
        (FeatureType.INT64, [1, 2.0], "expected int64, got float 2.0"),
        (FeatureType.INT64, ["1"], "expected int64, got str '1'"),
        (FeatureType.INT64, [None], "expected int64, got NoneType None"),
        (FeatureType.INT64, [[1]], "expected int64, got list [1]"),
        (FeatureType.FLOAT, [1.0, False], "expected float, got bool False"),
        (FeatureType.FLOAT, ["1.0"], "expected float, got str '1.0'"),
        (FeatureType.FLOAT, [10**400], "float out of float32 range"),
        (FeatureType.BYTES, [1], "expected bytes, got int 1"),
        (FeatureType.BYTES, ["\ud800"], "not valid UTF-8"),
        (FeatureType.BYTES, "abc", "expected a list of values, got str 'abc'"),
        (FeatureType.INT64, 5, "expected a list of values, got int 5"),
    ],
)
def test_wrong_python_types_are_refused(kind: FeatureType, values: Any, reason: str) -> None:
    with pytest.raises(EncodeError) as info:
        encode_one(kind, values)
    assert reason in info.value.reason
    assert info.value.feature == "feat"


def test_int_subclasses_other_than_bool_are_ints() -> None:
    from enum import IntEnum

    class Level(IntEnum):
        HIGH = 300

    msg: Any = proto.Example.FromString(encode_one(FeatureType.INT64, [Level.HIGH, -5]))
    assert list(msg.features.feature["feat"].int64_list.value) == [300, -5]


def test_sequence_errors_name_the_feature_list_and_step() -> None:
    writer = SequenceExampleWriter([("n", FeatureType.INT64)], [("labels", FeatureType.INT64)])
    with pytest.raises(EncodeError) as info:
        writer.encode([[2]], [[[1], [2**64]]])
    assert info.value.feature == "labels"
    assert info.value.reason.startswith("step 1: int64 out of range")
    with pytest.raises(EncodeError) as info:
        writer.encode([["x"]], [[]])
    assert info.value.feature == "n"
    steps_not_lists: Any = [[1, 2]]
    with pytest.raises(EncodeError) as info:
        writer.encode([None], steps_not_lists)
    assert info.value.feature == "labels"
    assert info.value.reason == "step 0: expected a list of values, got int 1"


def test_value_count_must_match_the_declaration() -> None:
    with pytest.raises(EncodeError, match="expected 2 feature values, got 1"):
        ExampleWriter([("a", FeatureType.INT64), ("b", FeatureType.INT64)]).encode([[1]])


def test_duplicate_feature_names_are_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        ExampleWriter([("a", FeatureType.INT64), ("a", FeatureType.FLOAT)])


@settings(max_examples=30)
@given(st.integers(1, 3000))
def test_long_lists_and_multibyte_lengths(n: int) -> None:
    values = [float(i) for i in range(n)]
    texts = ["x" * n]
    writer = ExampleWriter([("f", FeatureType.FLOAT), ("t", FeatureType.BYTES)])
    assert proto.parse_example(writer.encode([values, texts])) == {
        "f": values,
        "t": [t.encode() for t in texts],
    }


def test_clipped_keeps_reasons_short_whatever_the_value() -> None:
    from tfrecordd.format.wire import clipped

    assert clipped("abc") == "'abc'"
    long = clipped("x" * 10_000)
    assert len(long) == 40
    assert long.endswith("...")


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (10**5000, "<int of 16610 bits>"),
        (-(10**5000), "<-int of 16610 bits>"),
        ([1, 10**5000], "<list>"),
        (_nested(100000), "[[[[...]]]]"),
        (_BadRepr(), "<_BadRepr>"),
        ("x" * 1000, "'" + "x" * 36 + "..."),
        (1.5, "1.5"),
    ],
    ids=["huge-int", "huge-negative-int", "list-of-huge-int", "deep", "bad-repr", "long", "float"],
)
def test_an_offending_value_is_shown_short_whatever_it_is(value: Any, shown: str) -> None:
    # Error reasons are built from event values: showing one must never raise (an int past
    # Python's digit limit, a list deeper than repr recurses) nor grow with the value.
    assert clipped(value) == shown
    assert len(describe(value)) <= 60


def test_int64_out_of_range_far_beyond_the_digit_limit_is_refused() -> None:
    with pytest.raises(EncodeError) as info:
        ExampleWriter([("n", FeatureType.INT64)]).encode([[10**5000]])
    assert info.value.feature == "n"
    assert info.value.reason == "int64 out of range: <int of 16610 bits>"


@pytest.mark.parametrize("n", [0, 1, 127, 128, 1000, 16383, 16384, 100_000, 3_000_000])
def test_a_bytes_entry_head_is_what_the_writer_puts_before_the_value(n: int) -> None:
    from tfrecordd.format.wire import (
        BytesEntryHead,
        ExampleWriter,
        FeatureType,
        example_head,
        map_entries,
    )

    value = bytes(range(256)) * (n // 256) + bytes(n % 256)
    for key in ("image/encoded", "k", "ü" * 70):
        written = map_entries(ExampleWriter([(key, FeatureType.BYTES)]).encode([[value]]))
        assert BytesEntryHead(key)(n) + value == written
        assert map_entries(example_head(len(written)) + written) == written
