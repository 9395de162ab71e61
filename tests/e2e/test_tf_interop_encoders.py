"""TensorFlow reads each encoder's shards with exactly what ``tfrecordd schema`` prints."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from PIL import Image

from tests.support import tf_features
from tfrecordd.cli import main
from tfrecordd.config import load_config
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import open_writer
from tfrecordd.plugin import RawEvent

pytestmark = pytest.mark.tensorflow

CONFIG = """\
[daemon]
state_dir = "{root}/state"
[metrics]
enabled = false
[output]
dir = "{root}/out"
[[sources]]
name = "spool"
type = "directory"
path = "{root}/spool"
encoder = "rows"

[encoders.rows]
type = "example"
[encoders.rows.features]
id = {{ type = "int64", required = true, shape = [] }}
score = {{ type = "float", shape = [], default = -1.0 }}
name = "bytes"
xy = {{ type = "float", shape = [2], separator = ";", required = true }}

[encoders.tagging]
type = "sequence"
steps = "tokens"
[encoders.tagging.context]
id = {{ type = "bytes", shape = [], required = true }}
length = {{ type = "int64", path = "tokens", length = true, required = true }}
[encoders.tagging.feature_lists]
token = {{ type = "bytes", path = "text", shape = [], required = true }}
label = {{ type = "int64", path = "label", shape = [], required = true }}

[encoders.pets]
type = "image"
labels = {{ cat = 0, dog = 1 }}
"""


def printed(capsys: pytest.CaptureFixture[str], config: Path, name: str, fmt: str) -> str:
    assert main(["schema", "-c", str(config), "--encoder", name, "--format", fmt]) == 0
    return capsys.readouterr().out


def write_shard(path: Path, config: Path, name: str, events: list[RawEvent]) -> None:
    result = load_config(config).encoders[name].build().encode_batch(events)
    assert result.failures == []
    with open_writer(path, Compression.GZIP) as writer:
        writer.write_many(result.records)


def read_all(tf: Any, path: Path, parse: Any) -> Any:
    dataset = tf.data.TFRecordDataset([str(path)], compression_type="GZIP").batch(100)
    return [parse(batch) for batch in dataset]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tfrecordd.toml"
    path.write_text(CONFIG.format(root=tmp_path))
    return path


def test_example_from_json_and_csv(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tf = pytest.importorskip("tensorflow")
    events = [
        RawEvent(orjson.dumps({"id": 1, "score": 0.5, "name": ["a", "b"], "xy": [1, 2]}), "j:0"),
        RawEvent(b"", "c:1", {"id": "2", "score": "", "name": "c", "xy": "0.25;-4"}, "csv"),
        RawEvent(b"", "c:2", {"id": "-9", "score": "1e3", "name": "", "xy": "inf;0"}, "csv"),
    ]
    shard = tmp_path / "rows.tfrecord.gz"
    write_shard(shard, config, "rows", events)

    namespace: dict[str, Any] = {}
    exec(printed(capsys, config, "rows", "python"), namespace)
    from_json = tf_features(tf, json.loads(printed(capsys, config, "rows", "json")))
    assert namespace["features"] == from_json
    for features in (namespace["features"], from_json):
        (parsed,) = read_all(tf, shard, lambda b, f=features: tf.io.parse_example(b, f))
        assert parsed["id"].numpy().tolist() == [1, 2, -9]
        assert parsed["score"].numpy().tolist() == [0.5, -1.0, 1000.0]
        assert parsed["xy"].numpy().tolist() == [[1.0, 2.0], [0.25, -4.0], [float("inf"), 0.0]]
        names = tf.sparse.to_dense(parsed["name"], default_value=b"-").numpy().tolist()
        assert names == [[b"a", b"b"], [b"c", b"-"], [b"-", b"-"]]


def test_sequence_labelling(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tf = pytest.importorskip("tensorflow")
    sentences = [
        ("s1", [("Ada", 1), ("wrote", 0), ("notes", 0)]),
        ("s2", [("Grace", 1)]),
    ]
    events = [
        RawEvent(
            orjson.dumps({"id": i, "tokens": [{"text": t, "label": x} for t, x in s]}), f"j:{n}"
        )
        for n, (i, s) in enumerate(sentences)
    ]
    shard = tmp_path / "tagging.tfrecord.gz"
    write_shard(shard, config, "tagging", events)

    namespace: dict[str, Any] = {}
    exec(printed(capsys, config, "tagging", "python"), namespace)
    description = json.loads(printed(capsys, config, "tagging", "json"))
    context = tf_features(tf, description["context_features"])
    sequence = tf_features(tf, description["sequence_features"])
    assert (namespace["context_features"], namespace["sequence_features"]) == (context, sequence)
    (parsed,) = read_all(tf, shard, lambda b: tf.io.parse_sequence_example(b, context, sequence))
    context_values, lists, lengths = parsed
    assert context_values["id"].numpy().tolist() == [b"s1", b"s2"]
    assert context_values["length"].numpy().tolist() == [3, 1]
    assert lengths["token"].numpy().tolist() == [3, 1]
    assert lists["token"].numpy().tolist() == [[b"Ada", b"wrote", b"notes"], [b"Grace", b"", b""]]
    assert lists["label"].numpy().tolist() == [[1, 0, 0], [1, 0, 0]]


def test_images_decode_to_the_size_and_channels_written(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tf = pytest.importorskip("tensorflow")
    files: list[tuple[bytes, str, str]] = []
    for mode, fmt, label, save in [
        ("L", "PNG", "cat", {}),
        ("RGB", "PNG", "dog", {}),
        ("RGBA", "PNG", "cat", {}),
        ("P", "PNG", "dog", {}),
        ("P", "PNG", "dog", {"transparency": 0}),
        ("RGB", "JPEG", "cat", {}),
        ("L", "JPEG", "dog", {}),
        ("RGB", "GIF", "cat", {}),
    ]:
        buffer = io.BytesIO()
        Image.new(mode, (9 + len(files), 4)).save(buffer, format=fmt, **save)
        files.append((buffer.getvalue(), f"{len(files)}.{fmt.lower()}", label))
    events = [
        RawEvent(data, f"spool/{label}/{name}", {"filename": name, "label": label}, "file")
        for data, name, label in files
    ]
    shard = tmp_path / "pets.tfrecord.gz"
    write_shard(shard, config, "pets", events)

    namespace: dict[str, Any] = {}
    exec(printed(capsys, config, "pets", "python"), namespace)
    features = namespace["features"]
    assert features == tf_features(tf, json.loads(printed(capsys, config, "pets", "json")))
    (parsed,) = read_all(tf, shard, lambda b: tf.io.parse_example(b, features))
    assert parsed["image/encoded"].numpy().tolist() == [data for data, _, _ in files]
    assert parsed["image/class/label"].numpy().tolist() == [0, 1, 0, 1, 1, 0, 1, 0]
    assert parsed["image/class/text"].numpy().tolist() == [label.encode() for *_, label in files]
    for i, encoded in enumerate(parsed["image/encoded"]):
        image = tf.io.decode_image(encoded, expand_animations=False)
        height, width, channels = image.shape
        assert parsed["image/height"][i] == height
        assert parsed["image/width"][i] == width
        assert parsed["image/channels"][i] == channels, files[i][1]
    formats = parsed["image/format"].numpy().tolist()
    assert formats == [b"png"] * 5 + [b"jpeg"] * 2 + [b"gif"]
