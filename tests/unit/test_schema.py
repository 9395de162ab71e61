"""Declared schemas: what each rule accepts, what it refuses, and how the refusal is named."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfrecordd.cli.describe import feature_description, render_feature_description
from tfrecordd.errors import ConfigError, EncodeError
from tfrecordd.format import proto
from tfrecordd.format.wire import FeatureType
from tfrecordd.schema import ExampleSchema, FeatureSpec, SequenceSchema, parse_feature, parse_path


def encode(features: dict[str, Any], event: Any) -> dict[str, list[Any]]:
    return proto.parse_example(ExampleSchema(features).encode(event))


def refusal(features: dict[str, Any], event: Any) -> EncodeError:
    with pytest.raises(EncodeError) as info:
        ExampleSchema(features).encode(event)
    return info.value


# --- declaring features -------------------------------------------------------------------------


class EncoderConfig(pydantic.BaseModel, extra="forbid"):
    features: dict[str, FeatureSpec]


def test_short_and_long_forms_in_a_config_model() -> None:
    config = EncoderConfig.model_validate(
        {"features": {"age": "int64", "city": {"type": "bytes", "path": "address.city"}}}
    )
    assert config.features["age"] == FeatureSpec(type=FeatureType.INT64)
    assert config.features["city"].path == "address.city"
    assert parse_feature("float") == FeatureSpec(type=FeatureType.FLOAT)
    assert parse_feature({"type": "int64", "required": True}).required


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("int32", "Input should be 'int64', 'float' or 'bytes'"),
        ({"type": "int64", "requried": True}, "Extra inputs are not permitted"),
        (
            {"type": "int64", "required": True, "default": 1},
            "required feature cannot have a default",
        ),
        ({"type": "float", "time_unit": "ms"}, "time_unit applies to int64 features only"),
        ({"type": "bytes", "length": True}, "length applies to int64 features only"),
        ({"type": "int64", "default": "abc"}, "invalid default: expected int64, got str 'abc'"),
        ({"type": "int64", "default": [1, 2], "shape": [3]}, "invalid default: shape mismatch"),
        ({"type": "float", "default": 1e39}, "invalid default: float out of float32 range"),
        ({"type": "int64", "shape": [0]}, "shape dimensions must be >= 1"),
        ({"type": "int64", "path": "a..b"}, "invalid path 'a..b'"),
        ({"type": "int64", "time_unit": "ms", "default": "yesterday"}, "not an RFC 3339"),
    ],
)
def test_invalid_specs_are_refused_at_load_time(spec: Any, message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        parse_feature(spec)


def test_schema_reports_every_invalid_feature_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        ExampleSchema({"a": "int32", "b": "int64", "c": {"type": "float", "length": True}})
    assert len(info.value.errors) == 2
    assert info.value.errors[0].startswith("features.a.type: ")
    assert info.value.errors[1].startswith("features.c: ")


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("age", (("age", None),)),
        ("user.age", (("user", None), ("age", None))),
        ("items.0.id", (("items", None), ("0", 0), ("id", None))),
        ("items[0].id", (("items", None), (None, 0), ("id", None))),
        ("grid[1][-1]", (("grid", None), (None, 1), (None, -1))),
    ],
)
def test_path_syntax(path: str, steps: tuple[Any, ...]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize("path", ["", "a.", ".a", "a[x]", "a[1", "a]b"])
def test_bad_paths(path: str) -> None:
    with pytest.raises(ValueError, match="invalid path"):
        parse_path(path)


@pytest.mark.parametrize("digit", ["\uff11", "\u0661", "\u06f1", "\u0967"])
def test_an_index_is_written_in_ascii_digits(digit: str) -> None:
    # int() reads full-width, Arabic-Indic, Persian and Devanagari digits; a path does not.
    with pytest.raises(ValueError, match="invalid path"):
        parse_path(f"items[{digit}]")
    with pytest.raises(pydantic.ValidationError):
        FeatureSpec.model_validate({"type": "int64", "path": f"grid[0][{digit}]"})
    # A dotted segment of such digits is a key, never an index.
    assert parse_path(f"items.{digit}") == (("items", None), (digit, None))


# --- values ---------------------------------------------------------------------------------------


def test_scalars_lists_and_types() -> None:
    features = {"age": "int64", "score": "float", "tags": "bytes", "raw": "bytes"}
    event = {"age": 29, "score": [1, 2.5], "tags": ["a", "ü😀"], "raw": b"\x00\xff"}
    assert encode(features, event) == {
        "age": [29],
        "score": [1.0, 2.5],
        "tags": [b"a", "ü😀".encode()],
        "raw": [b"\x00\xff"],
    }


def test_missing_and_null_are_left_out_and_empty_lists_kept() -> None:
    features = {"a": "int64", "b": "float", "c": "bytes"}
    assert encode(features, {"b": None, "c": []}) == {"c": []}


def test_defaults_fill_missing_and_null_values() -> None:
    features = {
        "a": {"type": "int64", "default": 7},
        "b": {"type": "bytes", "default": ["x", "y"]},
        "c": {"type": "float", "default": 0.5},
    }
    assert encode(features, {"b": None, "c": 2.0}) == {"a": [7], "b": [b"x", b"y"], "c": [2.0]}


def test_missing_required_feature_is_refused_by_name() -> None:
    error = refusal({"a": "int64", "user": {"type": "bytes", "required": True}}, {"a": 1})
    assert (error.feature, error.reason) == ("user", "missing required feature")
    error = refusal({"user": {"type": "bytes", "required": True}}, {"user": None})
    assert (error.feature, error.reason) == ("user", "missing required feature")


@pytest.mark.parametrize(
    ("kind", "value", "reason"),
    [
        ("int64", "abc", "expected int64, got str 'abc'"),
        ("int64", 3.5, "expected int64, got float 3.5"),
        ("int64", [1, True], "expected int64, got bool True"),
        ("int64", 2**63, "int64 out of range: 9223372036854775808"),
        ("int64", -(2**63) - 1, "int64 out of range: -9223372036854775809"),
        ("int64", 1e19, "int64 out of range: 10000000000000000000"),
        ("int64", {"x": 1}, "expected int64, got dict {'x': 1}"),
        ("float", False, "expected float, got bool False"),
        ("float", "1.5", "expected float, got str '1.5'"),
        ("float", [1.0, 1e39], "float out of float32 range: 1e+39"),
        ("bytes", 5, "expected bytes, got int 5"),
        ("bytes", ["a", None], "expected bytes, got NoneType None"),
        ("int64", [[1, 2], [3, 4]], "nested list: declare a shape"),
    ],
)
def test_type_and_range_violations_name_feature_and_problem(
    kind: str, value: Any, reason: str
) -> None:
    error = refusal({"other": "int64", "feat": kind}, {"other": 1, "feat": value})
    assert (error.feature, error.reason) == ("feat", reason)


def test_int64_accepts_integral_floats_and_extremes() -> None:
    features = {"a": "int64", "b": "int64"}
    assert encode(features, {"a": [3.0, -0.0], "b": [-(2**63), 2**63 - 1]}) == {
        "a": [3, 0],
        "b": [-(2**63), 2**63 - 1],
    }


def test_event_that_is_not_an_object() -> None:
    error = refusal({"a": "int64"}, [1, 2])
    assert error.feature is None
    assert error.reason == "not an object: got list [1, 2]"


def test_events_decoded_by_orjson() -> None:
    raw = b'{"user": "alice", "age": 29, "ratings": [9, 8.5], "bought": true}'
    features = {"user": "bytes", "age": "int64", "ratings": "float"}
    assert encode(features, orjson.loads(raw)) == {
        "user": [b"alice"],
        "age": [29],
        "ratings": [9.0, 8.5],
    }


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1)),
    st.lists(st.floats(width=32)),
    st.lists(st.text()),
)
def test_any_valid_values_round_trip(
    ints: list[int], floats: list[float], texts: list[str]
) -> None:
    got = encode({"i": "int64", "f": "float", "t": "bytes"}, {"i": ints, "f": floats, "t": texts})
    assert got["i"] == ints
    assert [repr(x) for x in got["f"]] == [repr(x) for x in floats]
    assert got["t"] == [t.encode() for t in texts]


# --- paths ---------------------------------------------------------------------------------------


def test_paths_with_keys_and_indices() -> None:
    features = {
        "age": {"type": "int64", "path": "user.age"},
        "first": {"type": "int64", "path": "items.0.id"},
        "second": {"type": "int64", "path": "items[1].id"},
        "last": {"type": "int64", "path": "items[-1].id"},
        "zero_key": {"type": "bytes", "path": "by_rank.0"},
    }
    event = {
        "user": {"age": 40},
        "items": [{"id": 1}, {"id": 2}, {"id": 3}],
        "by_rank": {"0": "gold"},
    }
    assert encode(features, event) == {
        "age": [40],
        "first": [1],
        "second": [2],
        "last": [3],
        "zero_key": [b"gold"],
    }


def test_a_path_that_leads_nowhere_is_a_missing_value() -> None:
    features = {
        "a": {"type": "int64", "path": "user.age"},
        "b": {"type": "int64", "path": "items[5].id", "default": -1},
        "c": {"type": "int64", "path": "user.age", "required": True},
    }
    assert encode({k: features[k] for k in "ab"}, {"user": None, "items": []}) == {"b": [-1]}
    error = refusal(features, {"items": []})
    assert (error.feature, error.reason) == ("c", "missing required feature")


def test_a_path_through_a_scalar_is_refused() -> None:
    error = refusal({"age": {"type": "int64", "path": "user.age"}}, {"user": "alice"})
    assert error.feature == "age"
    assert error.reason == "path 'user.age': 'user' is str 'alice', not a container"
    error = refusal({"id": {"type": "int64", "path": "items[0]"}}, {"items": {"0": 1}})
    assert error.reason == "path 'items[0]': 'items' is an object, not a list"


# --- shapes --------------------------------------------------------------------------------------


def test_shape_flattens_row_major() -> None:
    features = {
        "m": {"type": "float", "shape": [2, 3]},
        "one": {"type": "int64", "shape": []},
        "v": {"type": "bytes", "shape": [2]},
    }
    event = {"m": [[1, 2, 3], [4, 5, 6]], "one": 4, "v": ["a", "b"]}
    assert encode(features, event) == {
        "m": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        "one": [4],
        "v": [b"a", b"b"],
    }


@pytest.mark.parametrize(
    ("shape", "value", "reason"),
    [
        ([2, 3], [[1, 2, 3], [4, 5]], "shape mismatch: expected [2, 3], got [2, 3] (ragged)"),
        ([2, 3], [1, 2, 3, 4, 5, 6], "shape mismatch: expected [2, 3], got [6]"),
        ([3], [1, 2], "shape mismatch: expected [3], got [2]"),
        ([3], 1, "shape mismatch: expected [3], got a scalar"),
        ([], [1], "shape mismatch: expected [], got [1]"),
        ([2], [[1], [2]], "shape mismatch: expected [2], got [2, 1]"),
    ],
)
def test_shape_mismatch(shape: list[int], value: Any, reason: str) -> None:
    error = refusal({"m": {"type": "int64", "shape": shape}}, {"m": value})
    assert (error.feature, error.reason) == ("m", reason)


def test_shaped_default() -> None:
    features = {"m": {"type": "int64", "shape": [2, 2], "default": [[0, 1], [1, 0]]}}
    assert encode(features, {}) == {"m": [0, 1, 1, 0]}


# --- timestamps ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        ("1970-01-01T00:00:00Z", "s", 0),
        ("2024-02-29T12:34:56Z", "s", 1709210096),
        ("2024-02-29T12:34:56.789Z", "ms", 1709210096789),
        ("2024-02-29T14:34:56.789+02:00", "ms", 1709210096789),
        ("2024-02-29t07:04:56.789-05:30", "ms", 1709210096789),
        ("2024-02-29 12:34:56.123456789z", "ns", 1709210096123456789),
        ("2024-02-29T12:34:56.1234567891234Z", "ns", 1709210096123456789),
        ("2024-02-29T12:34:56.999999Z", "s", 1709210096),
        ("1969-12-31T23:59:59.5Z", "s", -1),
        ("1969-12-31T23:59:59.5Z", "ms", -500),
        ("0001-01-01T00:00:00Z", "s", -62135596800),
        (1709210096, "ms", 1709210096000),
        (0.7, "ms", 700),
        (1709210096.123456, "us", 1709210096123456),
        (-0.5, "s", -1),
        (1.5, "ns", 1500000000),
    ],
)
def test_timestamps(value: Any, unit: str, expected: int) -> None:
    features = {"t": {"type": "int64", "time_unit": unit}}
    assert encode(features, {"t": value}) == {"t": [expected]}


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    st.integers(-23 * 60 - 59, 23 * 60 + 59),
    st.integers(0, 999_999),
)
def test_rfc3339_strings_are_exact(moment: datetime, offset_minutes: int, micros: int) -> None:
    moment = moment.replace(microsecond=micros)
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    text = local.isoformat(timespec="microseconds")
    expected_us = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    features = {"us": {"type": "int64", "time_unit": "us", "path": "t"}}
    features["s"] = {"type": "int64", "time_unit": "s", "path": "t"}
    got = encode(features, {"t": text})
    assert got["us"] == [expected_us]
    assert got["s"] == [expected_us // 10**6]
    in_ns = {"ns": {"type": "int64", "time_unit": "ns", "path": "t"}}
    if -(2**63) <= expected_us * 1000 < 2**63:
        assert encode(in_ns, {"t": text}) == {"ns": [expected_us * 1000]}
    else:
        assert refusal(in_ns, {"t": text}).reason.startswith("int64 out of range")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("2024-02-30T00:00:00Z", "invalid date in '2024-02-30T00:00:00Z'"),
        ("2024-01-01T24:00:00Z", "invalid time of day"),
        ("2016-12-31T23:59:60Z", "leap seconds are not supported"),
        ("2024-01-01T00:00:00", "not an RFC 3339 timestamp: '2024-01-01T00:00:00'"),
        ("2024-01-01T00:00:00+25:00", "invalid UTC offset"),
        ("1700000000", "not an RFC 3339 timestamp"),
        (True, "expected a timestamp, got bool True"),
        (float("inf"), "expected a timestamp, got float inf"),
        (1e30, "int64 out of range"),
    ],
)
def test_bad_timestamps(value: Any, reason: str) -> None:
    error = refusal({"t": {"type": "int64", "time_unit": "ms"}}, {"t": value})
    assert error.feature == "t"
    assert reason in error.reason


def test_a_list_of_timestamps() -> None:
    features = {"t": {"type": "int64", "time_unit": "s"}}
    assert encode(features, {"t": ["1970-01-01T00:01:00Z", 5]}) == {"t": [60, 5]}


# --- lengths -------------------------------------------------------------------------------------


def test_length_counts_the_list_at_its_path() -> None:
    features = {
        "n_items": {"type": "int64", "path": "items", "length": True},
        "n_tags": {"type": "int64", "path": "tags", "length": True, "default": 0},
    }
    assert encode(features, {"items": [{}, {}, {}]}) == {"n_items": [3], "n_tags": [0]}
    error = refusal(features, {"items": "abc"})
    assert (error.feature, error.reason) == ("n_items", "expected a list to count, got str 'abc'")


# --- sequences -----------------------------------------------------------------------------------


def labelling_schema(**kwargs: Any) -> SequenceSchema:
    return SequenceSchema(
        context={"length": {"type": "int64", "path": "tokens", "length": True, "required": True}},
        feature_lists={
            "tokens": {"type": "bytes", "required": True},
            "labels": {"type": "int64", "required": True},
        },
        **kwargs,
    )


def test_sequence_labelling_with_parallel_arrays() -> None:
    data = labelling_schema().encode({"tokens": ["I", "saw", "Bob"], "labels": [0, 0, 1]})
    assert proto.parse_sequence_example(data) == (
        {"length": [3]},
        {"tokens": [[b"I"], [b"saw"], [b"Bob"]], "labels": [[0], [0], [1]]},
    )


def test_parallel_arrays_must_have_the_same_length() -> None:
    with pytest.raises(EncodeError) as info:
        labelling_schema().encode({"tokens": ["I", "saw"], "labels": [0, 0, 1]})
    assert info.value.feature == "labels"
    assert info.value.reason == "length mismatch: 3 steps, but 'tokens' has 2"


def test_parallel_step_values_are_type_checked() -> None:
    with pytest.raises(EncodeError) as info:
        labelling_schema().encode({"tokens": ["I", "saw"], "labels": [0, "B-PER"]})
    assert info.value.feature == "labels"
    assert info.value.reason == "step 1: expected int64, got str 'B-PER'"
    with pytest.raises(EncodeError) as info:
        labelling_schema().encode({"tokens": ["I", None], "labels": [0, 1]})
    assert (info.value.feature, info.value.reason) == ("tokens", "step 1: missing required value")
    with pytest.raises(EncodeError) as info:
        labelling_schema().encode({"tokens": ["I"], "labels": 0})
    assert info.value.feature == "labels"
    assert info.value.reason == "expected a list with one value per step, got int 0"


def test_optional_parallel_array_may_be_absent() -> None:
    schema = SequenceSchema({}, {"a": "int64", "b": "float"})
    assert proto.parse_sequence_example(schema.encode({"a": [1, [2, 3], None]})) == (
        {},
        {"a": [[1], [2, 3], []]},
    )
    with pytest.raises(EncodeError) as info:
        labelling_schema().encode({"tokens": ["I"]})
    assert (info.value.feature, info.value.reason) == ("labels", "missing required feature list")


def steps_schema() -> SequenceSchema:
    return SequenceSchema(
        context={
            "id": {"type": "bytes", "path": "doc.id"},
            "length": {"type": "int64", "path": "doc.words", "length": True},
        },
        feature_lists={
            "tokens": {"type": "bytes", "path": "text", "required": True},
            "labels": {"type": "int64", "path": "tag.id", "default": -1},
            "scores": {"type": "float", "path": "scores"},
        },
        steps="doc.words",
    )


def test_steps_as_objects() -> None:
    event = {
        "doc": {
            "id": "d1",
            "words": [
                {"text": "I", "tag": {"id": 0}, "scores": [0.5, 0.25]},
                {"text": "saw"},
                {"text": "Bob", "tag": {"id": 1}, "scores": 1},
            ],
        }
    }
    assert proto.parse_sequence_example(steps_schema().encode(event)) == (
        {"id": [b"d1"], "length": [3]},
        {
            "tokens": [[b"I"], [b"saw"], [b"Bob"]],
            "labels": [[0], [-1], [1]],
            "scores": [[0.5, 0.25], [], [1.0]],
        },
    )


@pytest.mark.parametrize(
    ("event", "feature", "reason"),
    [
        ({"doc": {}}, None, "missing steps array 'doc.words'"),
        ({"doc": {"words": {"text": "I"}}}, "length", "expected a list to count, got dict"),
        ({"doc": {"words": [{"text": "I"}, "saw"]}}, None, "step 1 is not an object: got str"),
        ({"doc": {"words": [{"text": "I"}, {"tag": {}}]}}, "tokens", "step 1: missing required"),
        (
            {"doc": {"words": [{"text": "I", "tag": {"id": 0.5}}]}},
            "labels",
            "step 0: expected int64",
        ),
        ({"doc": {"id": 5, "words": []}}, "id", "expected bytes, got int 5"),
    ],
)
def test_steps_violations(event: Any, feature: str | None, reason: str) -> None:
    with pytest.raises(EncodeError) as info:
        steps_schema().encode(event)
    assert info.value.feature == feature
    assert info.value.reason.startswith(reason)


def test_steps_that_are_not_a_list() -> None:
    schema = SequenceSchema({}, {"tokens": "bytes"}, steps="words")
    with pytest.raises(EncodeError) as info:
        schema.encode({"words": "I saw Bob"})
    assert info.value.feature is None
    assert info.value.reason == "steps 'words': expected a list, got str 'I saw Bob'"


def test_zero_steps() -> None:
    data = steps_schema().encode({"doc": {"words": []}})
    assert proto.parse_sequence_example(data) == (
        {"length": [0]},
        {"tokens": [], "labels": [], "scores": []},
    )


def test_sequence_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        SequenceSchema({}, {"n": {"type": "int64", "length": True}}, steps="a..b")
    assert info.value.errors == [
        "feature_lists.n: length applies to context features only",
        "steps: invalid path 'a..b': bad segment ''",
    ]


# --- the reader's feature description ------------------------------------------------------------


def test_example_feature_description() -> None:
    schema = ExampleSchema(
        {
            "age": {"type": "int64", "shape": [], "required": True},
            "ratings": "float",
            "pixels": {"type": "float", "shape": [2, 2], "default": [[0, 0], [0, 1]]},
            "city": {"type": "bytes", "shape": [], "default": "none"},
            "maybe": {"type": "int64", "shape": [3]},
            "n": {"type": "int64", "path": "items", "length": True, "required": True},
        }
    )
    description = feature_description(schema)
    assert json.loads(json.dumps(description)) == description
    assert description == {
        "age": {"kind": "FixedLenFeature", "shape": [], "dtype": "int64"},
        "ratings": {"kind": "VarLenFeature", "dtype": "float32"},
        "pixels": {
            "kind": "FixedLenFeature",
            "shape": [2, 2],
            "dtype": "float32",
            "default_value": [[0, 0], [0, 1]],
        },
        "city": {
            "kind": "FixedLenFeature",
            "shape": [],
            "dtype": "string",
            "default_value": "none",
        },
        "maybe": {"kind": "VarLenFeature", "dtype": "int64"},
        "n": {"kind": "FixedLenFeature", "shape": [], "dtype": "int64"},
    }
    source = render_feature_description(description)
    assert "'age': tf.io.FixedLenFeature(shape=[], dtype=tf.int64)," in source
    assert "'ratings': tf.io.VarLenFeature(dtype=tf.float32)," in source
    assert "default_value=[[0, 0], [0, 1]]" in source
    compile(source, "<description>", "eval")


def test_sequence_feature_description() -> None:
    schema = SequenceSchema(
        context={"length": {"type": "int64", "path": "tokens", "length": True, "default": 0}},
        feature_lists={
            "tokens": {"type": "bytes", "shape": [], "required": True},
            "labels": {"type": "int64", "shape": [], "default": 0},
            "extra": "float",
        },
    )
    description = feature_description(schema)
    assert description == {
        "context_features": {
            "length": {"kind": "FixedLenFeature", "shape": [], "dtype": "int64", "default_value": 0}
        },
        "sequence_features": {
            "tokens": {
                "kind": "FixedLenSequenceFeature",
                "shape": [],
                "dtype": "string",
                "allow_missing": False,
            },
            "labels": {
                "kind": "FixedLenSequenceFeature",
                "shape": [],
                "dtype": "int64",
                "allow_missing": True,
            },
            "extra": {"kind": "VarLenFeature", "dtype": "float32"},
        },
    }
    source = render_feature_description(description)
    assert source.startswith("context_features = {\n")
    assert "\nsequence_features = {\n" in source
    compile(source, "<description>", "exec")


# --- CSV rows -----------------------------------------------------------------------------------


def encode_csv(features: dict[str, Any], row: dict[str, Any]) -> dict[str, list[Any]]:
    return proto.parse_example(ExampleSchema(features).encode_csv(row))


def csv_refusal(features: dict[str, Any], row: dict[str, Any]) -> EncodeError:
    with pytest.raises(EncodeError) as info:
        ExampleSchema(features).encode_csv(row)
    return info.value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("-7", -7),
        ("+3", 3),
        (" 12 ", 12),
        ("0", 0),
        (str(2**63 - 1), 2**63 - 1),
        (str(-(2**63)), -(2**63)),
    ],
)
def test_csv_int64_from_integer_text(text: str, value: int) -> None:
    assert encode_csv({"n": "int64"}, {"n": text}) == {"n": [value]}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("4.5", "expected int64, got text '4.5'"),
        ("3.0", "expected int64, got text '3.0'"),
        ("1e3", "expected int64, got text '1e3'"),
        ("abc", "expected int64, got text 'abc'"),
        ("1_000", "expected int64, got text '1_000'"),
        ("\u0664\u0662", "expected int64, got text '\u0664\u0662'"),
        (" ", "expected int64, got text ' '"),
        (str(2**63), f"int64 out of range: '{2**63}'"),
        (str(-(2**63) - 1), f"int64 out of range: '{-(2**63) - 1}'"),
        ("9" * 5000, "int64 out of range: '" + "9" * 36),
    ],
)
def test_csv_int64_refusals_name_the_feature(text: str, reason: str) -> None:
    error = csv_refusal({"n": "int64"}, {"n": text})
    assert error.feature == "n"
    assert error.reason.startswith(reason)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.5", 1.5),
        ("-.5", -0.5),
        ("1e3", 1000.0),
        ("7", 7.0),
        (" 2.5 ", 2.5),
        ("inf", math.inf),
        ("-Infinity", -math.inf),
        ("3.4028234e38", 3.4028234e38),
    ],
)
def test_csv_float_from_text(text: str, value: float) -> None:
    assert encode_csv({"x": "float"}, {"x": text})["x"] == [pytest.approx(value)]


def test_csv_float_nan() -> None:
    (value,) = encode_csv({"x": "float"}, {"x": "NaN"})["x"]
    assert math.isnan(value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("abc", "expected float, got text 'abc'"),
        ("1.5.2", "expected float, got text '1.5.2'"),
        ("0x10", "expected float, got text '0x10'"),
        ("1e400", "float out of float32 range: '1e400'"),
        ("1e39", "float out of float32 range: 1e+39"),
    ],
)
def test_csv_float_refusals_name_the_feature(text: str, reason: str) -> None:
    error = csv_refusal({"x": "float"}, {"x": text})
    assert (error.feature, error.reason) == ("x", reason)


def test_csv_bytes_are_the_text_as_utf8() -> None:
    row = {"name": " na\u00efve, \U0001f600 "}
    assert encode_csv({"name": "bytes"}, row) == {"name": [" na\u00efve, \U0001f600 ".encode()]}


def test_csv_empty_field_or_missing_column_is_a_missing_value() -> None:
    features = {
        "a": "int64",
        "b": {"type": "float", "default": 0.5},
        "c": {"type": "bytes", "default": "none"},
    }
    assert encode_csv(features, {"a": "", "b": ""}) == {"b": [0.5], "c": [b"none"]}
    assert encode_csv(features, {"a": None}) == {"b": [0.5], "c": [b"none"]}
    error = csv_refusal({"id": {"type": "int64", "required": True}}, {"id": ""})
    assert (error.feature, error.reason) == ("id", "missing required feature (column 'id')")


def test_csv_path_is_the_header_name() -> None:
    features = {"age": {"type": "int64", "path": "Age (years)"}, "city": "bytes"}
    assert encode_csv(features, {"Age (years)": "31", "city": "Oslo", "age": "99"}) == {
        "age": [31],
        "city": [b"Oslo"],
    }


def test_csv_separator_makes_a_list() -> None:
    features = {
        "ids": {"type": "int64", "separator": ";"},
        "tags": {"type": "bytes", "separator": "|"},
        "xy": {"type": "float", "separator": ",", "shape": [2]},
        "n_tags": {"type": "int64", "path": "tags", "separator": "|", "length": True},
        "one": "bytes",
    }
    row = {"ids": "1; 2;3", "tags": "a||b", "xy": "0.5,-1", "one": "a;b"}
    assert encode_csv(features, row) == {
        "ids": [1, 2, 3],
        "tags": [b"a", b"", b"b"],
        "xy": [0.5, -1.0],
        "n_tags": [3],
        "one": [b"a;b"],
    }


@pytest.mark.parametrize(
    ("spec", "text", "reason"),
    [
        ({"type": "int64", "separator": ";"}, "1;;3", "value 1: expected int64, got text ''"),
        ({"type": "int64", "separator": ";"}, "1;x", "value 1: expected int64, got text 'x'"),
        ({"type": "float", "separator": ",", "shape": [3]}, "1,2", "shape mismatch: shape [3]"),
        ({"type": "float", "shape": [2]}, "1,2", "expected float, got text '1,2'"),
    ],
)
def test_csv_list_refusals(spec: dict[str, Any], text: str, reason: str) -> None:
    error = csv_refusal({"v": spec}, {"v": text})
    assert error.feature == "v"
    assert error.reason.startswith(reason)


def test_csv_timestamps() -> None:
    features = {"t": {"type": "int64", "time_unit": "ms"}}
    assert encode_csv(features, {"t": "1700000000"}) == {"t": [1_700_000_000_000]}
    assert encode_csv(features, {"t": "0.7"}) == {"t": [700]}
    assert encode_csv(features, {"t": "1970-01-01T00:00:01.5Z"}) == {"t": [1500]}
    assert csv_refusal(features, {"t": "yesterday"}).reason.startswith("not an RFC 3339")


def test_csv_field_that_is_not_text_is_refused() -> None:
    error = csv_refusal({"n": "int64"}, {"n": 42})
    assert (error.feature, error.reason) == ("n", "expected text, got int 42")
    with pytest.raises(EncodeError, match="not an object"):
        ExampleSchema({"n": "int64"}).encode_csv(["42"])  # type: ignore[arg-type]


def test_csv_and_json_of_the_same_data_encode_the_same_bytes() -> None:
    schema = ExampleSchema(
        {
            "id": "int64",
            "score": "float",
            "name": "bytes",
            "xs": {"type": "int64", "separator": " "},
        }
    )
    as_json = schema.encode({"id": 7, "score": 0.25, "name": "x", "xs": [1, 2]})
    assert schema.encode_csv({"id": "7", "score": "0.25", "name": "x", "xs": "1 2"}) == as_json


def test_separator_must_not_be_empty() -> None:
    with pytest.raises(pydantic.ValidationError, match="separator must not be empty"):
        parse_feature({"type": "bytes", "separator": ""})


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_csv_int64_round_trips(n: int) -> None:
    assert encode_csv({"n": "int64"}, {"n": str(n)}) == {"n": [n]}


@given(st.floats(width=32))
def test_csv_float32_round_trips(x: float) -> None:
    (value,) = encode_csv({"x": "float"}, {"x": repr(x)})["x"]
    assert value == x or (math.isnan(x) and math.isnan(value))
