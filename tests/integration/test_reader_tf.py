"""``tfrecordd.reader.tf_dataset`` and ``tf_features`` read real shards with real TensorFlow:
a partitioned dataset parsed through its schema's feature description, in every compression
TensorFlow reads, as Examples and SequenceExamples, batched and record by record."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tfrecordd.cli.describe import feature_description, render_feature_description
from tfrecordd.errors import TfrecorddError
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.writer import open_writer
from tfrecordd.reader import iter_records, list_shards, tf_dataset, tf_features
from tfrecordd.schema import ExampleSchema, SequenceSchema

pytestmark = pytest.mark.tensorflow

SCHEMA = ExampleSchema(
    {
        "user": {"type": "bytes", "shape": [], "required": True},
        "age": {"type": "int64", "shape": [], "default": -1},
        "movies": "bytes",
        "score": {"type": "float", "shape": [], "default": math.nan},
    }
)
EVENTS: list[dict[str, Any]] = [
    {"user": f"u{i}", "movies": [f"m{j}" for j in range(i % 3)]}
    | ({"age": 20 + i} if i % 2 else {})
    | ({"score": i / 2} if i % 3 else {})
    for i in range(11)
]


@pytest.fixture(scope="module")
def tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def write(path: Path, records: list[bytes], compression: Compression) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_writer(path, compression) as w:
        for i, record in enumerate(records):
            w.write(record)
            if i % 3 == 2:
                w.sync()
    return path


def dataset(root: Path, compression: Compression, records: list[bytes]) -> Path:
    """``records`` over three shards in two hour partitions, with a hidden in-progress file
    beside them that ``tf.data`` must never be handed."""
    suffix = SUFFIXES[compression]
    parts = [records[:4], records[4:9], records[9:]]
    folders = ["dt=2026-11-25/hour=03", "dt=2026-11-25/hour=03", "dt=2026-11-25/hour=04"]
    for i, (folder, part) in enumerate(zip(folders, parts, strict=True)):
        write(
            root / folder / f"part-20261125T030000.00000{i}Z-n-a1b2c3-00000{i}{suffix}",
            part,
            compression,
        )
    (root / folders[0] / f".part-x{suffix.replace('.', '_')}.inprogress").write_bytes(b"junk")
    return root


def unbatch(tf: Any, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Batches of parsed features as one dict per record, sparse features as lists."""
    out: list[dict[str, Any]] = []
    for batch in batches:
        dense = {
            k: v.numpy().tolist() for k, v in batch.items() if not isinstance(v, tf.SparseTensor)
        }
        sparse = {
            k: tf.sparse.to_dense(v).numpy().tolist() for k, v in batch.items() if k not in dense
        }
        for i in range(len(next(iter(dense.values())))):
            row = {k: v[i] for k, v in dense.items()}
            row |= {k: [x for x in v[i] if x != b""] for k, v in sparse.items()}
            out.append(row)
    return out


def expected(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "user": event["user"].encode(),
        "age": event.get("age", -1),
        "movies": [m.encode() for m in event["movies"]],
        "score": event.get("score", math.nan),
    }


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.ZLIB, Compression.NONE])
def test_a_dataset_read_through_its_schema_description(
    tf: Any, tmp_path: Path, compression: Compression
) -> None:
    root = dataset(tmp_path / "movies", compression, [SCHEMA.encode(e) for e in EVENTS])
    # what `tfrecordd schema --format json` prints (strict JSON: NaN as a string), read back
    description = json.loads(json.dumps(feature_description(SCHEMA)))
    description["score"]["default_value"] = "NaN"
    batches = list(tf_dataset(root, description, batch_size=4))
    assert [len(b["user"]) for b in batches] == [4, 4, 3]
    rows = unbatch(tf, batches)
    scores = [row.pop("score") for row in rows]
    assert rows == [{k: v for k, v in expected(e).items() if k != "score"} for e in EVENTS]
    for score, event in zip(scores, EVENTS, strict=True):
        want = event.get("score", math.nan)
        assert math.isnan(score) if math.isnan(want) else score == want
    raw = [t.numpy() for t in tf_dataset(root, batch_size=None)]
    assert raw == [r for s in list_shards(root) for r in iter_records(s.path)]


def test_feature_objects_and_one_record_at_a_time(tf: Any, tmp_path: Path) -> None:
    root = dataset(tmp_path / "movies", Compression.GZIP, [SCHEMA.encode(e) for e in EVENTS])
    features = {
        "user": tf.io.FixedLenFeature([], tf.string),
        "movies": tf.io.VarLenFeature(tf.string),
    }
    shards = list_shards(root, partitions=["*/hour=04"])
    records = list(tf_dataset(shards, features, batch_size=None))
    assert [r["user"].numpy() for r in records] == [b"u9", b"u10"]
    assert [r["movies"].values.numpy().tolist() for r in records] == [[], [b"m0"]]
    dropped = list(tf_dataset(root, features, batch_size=4, drop_remainder=True))
    assert [len(b["user"]) for b in dropped] == [4, 4]


def test_tf_features_match_the_printed_description(tf: Any) -> None:
    description = feature_description(SCHEMA)
    printed = eval(render_feature_description(description), {"tf": tf})
    assert repr(tf_features(description)) == repr(printed)  # repr: a NaN default is no NaN's equal
    strict = {  # the strict JSON form of a NaN default, and a nested one
        "x": {"kind": "FixedLenFeature", "shape": [], "dtype": "float32", "default_value": "NaN"},
        "m": {
            "kind": "FixedLenFeature",
            "shape": [2],
            "dtype": "float32",
            "default_value": ["-Infinity", 1.5],
        },
        "s": {"kind": "FixedLenFeature", "shape": [], "dtype": "string", "default_value": "NaN"},
    }
    features = tf_features(strict)
    assert math.isnan(features["x"].default_value)
    assert features["m"].default_value == [-math.inf, 1.5]
    assert features["s"].default_value == "NaN"  # a string default stays a string
    with pytest.raises(TfrecorddError, match="feature 'y': unknown kind 'DenseFeature'"):
        tf_features({"y": {"kind": "DenseFeature", "dtype": "int64"}})


def test_sequence_examples(tf: Any, tmp_path: Path) -> None:
    schema = SequenceSchema(
        context={"length": {"type": "int64", "path": "words", "length": True, "required": True}},
        feature_lists={
            "tokens": {"type": "bytes", "path": "text", "shape": [], "required": True},
            "labels": {"type": "int64", "path": "tag", "shape": [], "default": 0},
        },
        steps="words",
    )
    events = [{"words": [{"text": f"w{j}", "tag": j} for j in range(n)]} for n in (1, 3, 2)]
    path = write(
        tmp_path / "seq" / "part-1.tfrecord.gz",
        [schema.encode(e) for e in events],
        Compression.GZIP,
    )
    description = feature_description(schema)
    context, lists, lengths = next(iter(tf_dataset([path], description, batch_size=3)))
    assert context["length"].numpy().tolist() == [1, 3, 2]
    assert lists["tokens"].numpy().tolist() == [
        [b"w0", b"", b""],
        [b"w0", b"w1", b"w2"],
        [b"w0", b"w1", b""],
    ]
    assert lengths["labels"].numpy().tolist() == [1, 3, 2]
    single = [
        (c["length"].numpy(), s["labels"].numpy().tolist())
        for c, s in tf_dataset([path], description, batch_size=None)
    ]
    assert single == [(1, [0]), (3, [0, 1, 2]), (2, [0, 1])]


def test_what_tensorflow_cannot_read_is_refused_with_what_to_do(tmp_path: Path) -> None:
    zstd = write(tmp_path / "part-1.tfrecord.zst", [b"x"], Compression.ZSTD)
    with pytest.raises(TfrecorddError, match=r"cannot read zstd shards: transcode them to gzip"):
        tf_dataset([zstd])
    gz = write(tmp_path / "part-2.tfrecord.gz", [b"x"], Compression.GZIP)
    with pytest.raises(TfrecorddError, match="mix compressions"):
        tf_dataset(tmp_path)
    assert [s.name for s in list_shards(tmp_path)] == [zstd.name, gz.name]
