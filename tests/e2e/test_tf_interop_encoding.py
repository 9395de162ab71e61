"""TensorFlow's own parsers read back exactly what the wire writers and schemas wrote."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from tests.support import tf_features
from tfrecordd.cli.describe import feature_description, render_feature_description
from tfrecordd.format.wire import ExampleWriter, FeatureType, SequenceExampleWriter
from tfrecordd.schema import ExampleSchema, SequenceSchema

pytestmark = pytest.mark.tensorflow

INT64_EXTREMES = [-(2**63), -1, 0, 1, 127, 128, 2**31, 2**63 - 1]
FLOATS = [0.0, -0.0, 1.5, 1e-45, 3.4028234663852886e38, -3.4028234663852886e38, 0.1, 1 / 3]
TEXTS = ["", "a", "na\u00efve", "\x00nul", "\U0001f600 non-BMP", "\u65e5\u672c"]


def float32(values: list[float]) -> list[float]:
    return [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]


def plain(tf: Any, value: Any) -> Any:
    """A parsed tensor as Python values: a VarLenFeature's values, a dense tensor's nested list."""
    if isinstance(value, tf.SparseTensor):
        value = value.values
    array = value.numpy()
    return array if isinstance(array, bytes) else array.tolist()


def test_parse_single_example_reads_back_every_value() -> None:
    tf = pytest.importorskip("tensorflow")
    writer = ExampleWriter(
        [
            ("ints", FeatureType.INT64),
            ("floats", FeatureType.FLOAT),
            ("texts", FeatureType.BYTES),
            ("empty", FeatureType.FLOAT),
            ("\u7279\u5fb4 \U0001f600", FeatureType.INT64),
        ]
    )
    data = writer.encode([INT64_EXTREMES, FLOATS, TEXTS, [], [42]])
    parsed = tf.io.parse_single_example(
        data,
        {
            "ints": tf.io.VarLenFeature(tf.int64),
            "floats": tf.io.VarLenFeature(tf.float32),
            "texts": tf.io.VarLenFeature(tf.string),
            "empty": tf.io.VarLenFeature(tf.float32),
            "\u7279\u5fb4 \U0001f600": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    assert parsed["ints"].values.numpy().tolist() == INT64_EXTREMES
    assert parsed["floats"].values.numpy().tolist() == float32(FLOATS)
    assert [struct.pack("<f", v) for v in parsed["floats"].values.numpy().tolist()] == [
        struct.pack("<f", v) for v in FLOATS
    ]
    assert parsed["texts"].values.numpy().tolist() == [t.encode() for t in TEXTS]
    assert parsed["empty"].values.numpy().tolist() == []
    assert parsed["\u7279\u5fb4 \U0001f600"].numpy().tolist() == 42


def test_parse_single_sequence_example_reads_back_every_step() -> None:
    tf = pytest.importorskip("tensorflow")
    writer = SequenceExampleWriter(
        [("length", FeatureType.INT64), ("id", FeatureType.BYTES)],
        [("tokens", FeatureType.BYTES), ("labels", FeatureType.INT64), ("emb", FeatureType.FLOAT)],
    )
    tokens = [[t] for t in TEXTS]
    labels = [[v] for v in INT64_EXTREMES[: len(TEXTS)]]
    emb = [[v, -v] for v in FLOATS[: len(TEXTS)]]
    data = writer.encode([[len(TEXTS)], ["doc-\u00e9"]], [tokens, labels, emb])
    context, sequence = tf.io.parse_single_sequence_example(
        data,
        context_features={
            "length": tf.io.FixedLenFeature([], tf.int64),
            "id": tf.io.FixedLenFeature([], tf.string),
        },
        sequence_features={
            "tokens": tf.io.FixedLenSequenceFeature([], tf.string),
            "labels": tf.io.FixedLenSequenceFeature([], tf.int64),
            "emb": tf.io.FixedLenSequenceFeature([2], tf.float32),
        },
    )
    assert context["length"].numpy().tolist() == len(TEXTS)
    assert context["id"].numpy() == "doc-\u00e9".encode()
    assert sequence["tokens"].numpy().tolist() == [t.encode() for t in TEXTS]
    assert sequence["labels"].numpy().tolist() == INT64_EXTREMES[: len(TEXTS)]
    assert sequence["emb"].numpy().tolist() == [float32(step) for step in emb]


def test_schema_output_parses_with_its_own_feature_description() -> None:
    tf = pytest.importorskip("tensorflow")
    schema = ExampleSchema(
        {
            "user": {"type": "bytes", "shape": [], "required": True},
            "age": {"type": "int64", "shape": [], "default": -1},
            "movies": "bytes",
            "ratings": {"type": "float", "path": "scores.ratings"},
            "pixels": {"type": "float", "shape": [2, 2], "required": True},
            "seen_at": {"type": "int64", "time_unit": "ms", "shape": [], "required": True},
            "n_movies": {"type": "int64", "path": "movies", "length": True, "default": 0},
        }
    )
    event = {
        "user": "\u00e9lise",
        "movies": ["Up", "Alien"],
        "scores": {"ratings": [9.5, 0.1]},
        "pixels": [[0, 1], [2.5, 3]],
        "seen_at": "2024-02-29T14:34:56.789+02:00",
    }
    description = feature_description(schema)
    features = tf_features(tf, description)
    assert features == eval(render_feature_description(description), {"tf": tf})
    parsed = tf.io.parse_single_example(schema.encode(event), features)
    assert {name: plain(tf, value) for name, value in parsed.items()} == {
        "user": "\u00e9lise".encode(),
        "age": -1,
        "movies": [b"Up", b"Alien"],
        "ratings": float32([9.5, 0.1]),
        "pixels": [[0.0, 1.0], [2.5, 3.0]],
        "seen_at": 1709210096789,
        "n_movies": 2,
    }


def test_sequence_schema_output_parses_with_its_own_feature_description() -> None:
    tf = pytest.importorskip("tensorflow")
    schema = SequenceSchema(
        context={"length": {"type": "int64", "path": "words", "length": True, "required": True}},
        feature_lists={
            "tokens": {"type": "bytes", "path": "text", "shape": [], "required": True},
            "labels": {"type": "int64", "path": "tag", "shape": [], "default": 0},
            "chars": {"type": "bytes", "path": "chars"},
        },
        steps="words",
    )
    event = {
        "words": [
            {"text": "I", "tag": 0, "chars": ["I"]},
            {"text": "saw", "chars": ["s", "a", "w"]},
            {"text": "\U0001f600", "tag": 1},
        ]
    }
    description = feature_description(schema)
    context_features = tf_features(tf, description["context_features"])
    sequence_features = tf_features(tf, description["sequence_features"])
    namespace: dict[str, Any] = {"tf": tf}
    exec(render_feature_description(description), namespace)
    assert namespace["context_features"] == context_features
    assert namespace["sequence_features"] == sequence_features
    context, sequence = tf.io.parse_single_sequence_example(
        schema.encode(event),
        context_features=context_features,
        sequence_features=sequence_features,
    )
    assert context["length"].numpy().tolist() == 3
    assert sequence["tokens"].numpy().tolist() == [b"I", b"saw", "\U0001f600".encode()]
    assert sequence["labels"].numpy().tolist() == [0, 0, 1]
    chars = sequence["chars"]
    assert chars.indices.numpy().tolist() == [[0, 0], [1, 0], [1, 1], [1, 2]]
    assert chars.values.numpy().tolist() == [b"I", b"s", b"a", b"w"]
