"""The built-in encoders and a third-party one: records checked by protobuf's own parser, bad
events reported with their index, a category and a reason naming the feature."""

from __future__ import annotations

import io
import re
import struct
import sys
import tomllib
import types
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from PIL import Image

from tfrecordd.cli import main
from tfrecordd.config import parse_config
from tfrecordd.errors import TfrecorddError
from tfrecordd.format import proto
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import RecordWriter
from tfrecordd.plugin import EncoderConfig, EncodeResult, RawEvent, Registry
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.encoders.image import ImageEncoderConfig
from tfrecordd_plugins.encoders.passthrough import PassthroughEncoderConfig
from tfrecordd_plugins.encoders.sequence import SequenceEncoderConfig
from tfrecordd_plugins.sources.directory import DirectorySourceConfig

DOCS = Path(__file__).parents[2] / "docs" / "encoders.md"


def docs_block(marker: str) -> str:
    """The fenced code block that follows ``<!-- marker -->`` in docs/encoders.md."""
    match = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```", DOCS.read_text(), re.S)
    assert match is not None, marker
    return match.group(1)


def json_event(value: Any) -> RawEvent:
    return RawEvent(orjson.dumps(value), "test:0")


def csv_event(row: dict[str, str]) -> RawEvent:
    return RawEvent(b",".join(v.encode() for v in row.values()), "test.csv:1", row, "csv")


def file_event(data: bytes, filename: str = "x.png", label: str = "cat") -> RawEvent:
    value = {"filename": filename, "label": label, "path": f"{label}/{filename}"}
    return RawEvent(data, f"spool/{label}/{filename}", value, "file")


def encode_all(config: EncoderConfig, events: list[RawEvent]) -> EncodeResult:
    result = config.build().encode_batch(events)
    assert len(result.records) + len(result.failures) == len(events)
    return result


# --- example -----------------------------------------------------------------------------------


def test_example_encoder_takes_json_and_csv_in_one_batch() -> None:
    config = ExampleEncoderConfig.model_validate(
        {
            "type": "example",
            "features": {
                "id": {"type": "int64", "required": True},
                "score": "float",
                "tags": {"type": "bytes", "separator": "|"},
            },
        }
    )
    result = encode_all(
        config,
        [
            json_event({"id": 1, "score": 0.5, "tags": ["a", "b"]}),
            csv_event({"id": "2", "score": "1e3", "tags": "c|d"}),
            csv_event({"id": "4.5", "score": "1", "tags": ""}),
            json_event({"id": "3"}),
            RawEvent(b"{not json", "test:9"),
            csv_event({"id": "", "score": "nan"}),
            RawEvent(b"\x89PNG", "spool/x.png", {"filename": "x.png"}, "file"),
        ],
    )
    assert [proto.parse_example(r) for r in result.records] == [
        {"id": [1], "score": [0.5], "tags": [b"a", b"b"]},
        {"id": [2], "score": [1000.0], "tags": [b"c", b"d"]},
    ]
    assert result.failures == [
        (2, "schema", "feature 'id': expected int64, got text '4.5'"),
        (3, "schema", "feature 'id': expected int64, got str '3'"),
        (4, "malformed", result.failures[2][2]),
        (5, "schema", "feature 'id': missing required feature (column 'id')"),
        (6, "format", "cannot encode 'file' events as an Example"),
    ]
    assert result.failures[2][2].startswith("not valid JSON")


def test_example_encoder_int64_out_of_range_is_refused_not_wrapped() -> None:
    config = ExampleEncoderConfig.model_validate({"features": {"n": "int64"}})
    result = encode_all(config, [json_event({"n": 2**63}), csv_event({"n": str(2**64 + 1)})])
    assert result.records == []
    assert [f[1:] for f in result.failures] == [
        ("schema", f"feature 'n': int64 out of range: {2**63}"),
        ("schema", f"feature 'n': int64 out of range: '{2**64 + 1}'"),
    ]


# --- sequence ----------------------------------------------------------------------------------


def tagging_config() -> SequenceEncoderConfig:
    toml = tomllib.loads(docs_block("sequence-labelling-config"))
    return SequenceEncoderConfig.model_validate(toml["encoders"]["tagging"])


def test_documented_sequence_labelling_config_encodes_tokens_and_labels() -> None:
    event = {"id": "s1", "tokens": [{"text": "Ada", "label": 1}, {"text": "wrote", "label": 0}]}
    result = encode_all(tagging_config(), [json_event(event)])
    assert result.failures == []
    context, lists = proto.parse_sequence_example(result.records[0])
    assert context == {"id": [b"s1"], "length": [2]}
    assert lists == {"token": [[b"Ada"], [b"wrote"]], "label": [[1], [0]]}


def test_sequence_encoder_refuses_bad_steps_naming_feature_and_step() -> None:
    events = [
        {"id": "a", "tokens": [{"text": "x", "label": 0}, {"text": "y", "label": "B-PER"}]},
        {"id": "b", "tokens": [{"text": "x", "label": 0}, {"label": 1}]},
        {"id": "c", "tokens": "x y"},
        {"tokens": []},
    ]
    result = encode_all(tagging_config(), [json_event(e) for e in events])
    assert result.records == []
    assert result.failures == [
        (0, "schema", "feature 'label': step 1: expected int64, got str 'B-PER'"),
        (1, "schema", "feature 'token': step 1: missing required value"),
        (2, "schema", "feature 'length': expected a list to count, got str 'x y'"),
        (3, "schema", "feature 'id': missing required feature"),
    ]


def test_sequence_encoder_parallel_arrays_and_other_formats() -> None:
    config = SequenceEncoderConfig.model_validate(
        {
            "context": {"n": {"type": "int64", "path": "words", "length": True}},
            "feature_lists": {"words": "bytes", "tags": "int64"},
        }
    )
    result = encode_all(
        config,
        [
            json_event({"words": ["a", "b"], "tags": [1, 2]}),
            json_event({"words": ["a", "b"], "tags": [1]}),
            csv_event({"words": "a"}),
            RawEvent(b"[", "test:3"),
        ],
    )
    assert proto.parse_sequence_example(result.records[0]) == (
        {"n": [2]},
        {"words": [[b"a"], [b"b"]], "tags": [[1], [2]]},
    )
    assert [f[:2] for f in result.failures] == [(1, "schema"), (2, "format"), (3, "malformed")]
    assert result.failures[0][2] == "feature 'tags': length mismatch: 1 steps, but 'words' has 2"


def test_sequence_config_errors_are_config_errors_with_locations() -> None:
    data = {
        "output": {"dir": "/tmp/out"},
        "sources": [{"name": "s", "type": "directory", "path": "/tmp/in", "encoder": "seq"}],
        "encoders": {
            "seq": {"type": "sequence", "feature_lists": {"n": {"type": "int64", "length": True}}}
        },
    }
    registry = Registry({"directory": DirectorySourceConfig}, {"sequence": SequenceEncoderConfig})
    with pytest.raises(TfrecorddError) as info:
        parse_config(data, registry)
    assert "encoders.seq: feature_lists.n: length applies to context features only" in str(
        info.value
    )


# --- image -------------------------------------------------------------------------------------


def image_bytes(mode: str, fmt: str, size: tuple[int, int] = (7, 5), **save: Any) -> bytes:
    image = Image.new(mode, size)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


IMAGES = [
    ("L", "PNG", {}, "png", 1),
    ("LA", "PNG", {}, "png", 2),
    ("RGB", "PNG", {}, "png", 3),
    ("RGBA", "PNG", {}, "png", 4),
    ("P", "PNG", {}, "png", 3),
    ("P", "PNG", {"transparency": 0}, "png", 4),
    ("L", "JPEG", {}, "jpeg", 1),
    ("RGB", "JPEG", {}, "jpeg", 3),
    ("P", "GIF", {}, "gif", 3),
    ("L", "GIF", {}, "gif", 3),
    ("RGB", "BMP", {}, "bmp", 3),
    ("RGBA", "WEBP", {"lossless": True}, "webp", 4),
]


@pytest.mark.parametrize(("mode", "pillow_format", "save", "fmt", "channels"), IMAGES)
def test_image_features_from_the_header(
    mode: str, pillow_format: str, save: dict[str, Any], fmt: str, channels: int
) -> None:
    data = image_bytes(mode, pillow_format, **save)
    config = ImageEncoderConfig.model_validate({"type": "image", "labels": {"cat": 3}})
    result = encode_all(config, [file_event(data, f"a.{fmt}", "cat")])
    assert result.failures == []
    assert proto.parse_example(result.records[0]) == {
        "image/encoded": [data],
        "image/format": [fmt.encode()],
        "image/height": [5],
        "image/width": [7],
        "image/channels": [channels],
        "image/filename": [f"a.{fmt}".encode()],
        "image/class/text": [b"cat"],
        "image/class/label": [3],
    }


def test_image_refusals_name_the_feature() -> None:
    png = image_bytes("RGB", "PNG", (40, 30))
    jpeg = image_bytes("RGB", "JPEG", (40, 30))
    config = ImageEncoderConfig.model_validate({"labels": {"cat": 0}, "formats": ["png", "jpeg"]})
    events = [
        file_event(b"not an image at all"),
        file_event(png[: len(png) // 2]),
        file_event(jpeg[: len(jpeg) - 10], "a.jpg"),
        file_event(image_bytes("P", "GIF"), "a.gif"),
        file_event(png, label="bird"),
        file_event(png[:20]),
        RawEvent(png, "socket:1"),
    ]
    result = encode_all(config, events)
    assert result.records == []
    failures = {i: (category, detail) for i, category, detail in result.failures}
    assert failures[0] == (
        "malformed",
        "feature 'image/encoded': not an image in an allowed format (png, jpeg)",
    )
    assert failures[1][0] == failures[2][0] == failures[5][0] == "malformed"
    assert failures[1][1].startswith("feature 'image/encoded': ")
    assert "JPEG without its end-of-image marker" in failures[2][1]
    assert failures[3] == failures[0]
    assert failures[4] == (
        "label",
        "feature 'image/class/label': folder 'bird' is not in labels (known: cat)",
    )
    assert failures[6] == ("format", "expected a whole-file event, got None")


def test_truncation_check_can_be_turned_off_for_appended_data() -> None:
    jpeg = image_bytes("RGB", "JPEG") + b"appended by a camera"
    strict = encode_all(ImageEncoderConfig(), [file_event(jpeg, "a.jpg")])
    assert [f[1] for f in strict.failures] == ["malformed"]
    lenient = encode_all(ImageEncoderConfig(check_complete=False), [file_event(jpeg, "a.jpg")])
    assert proto.parse_example(lenient.records[0])["image/encoded"] == [jpeg]


def test_unknown_label_omitted_and_no_labels_at_all() -> None:
    png = image_bytes("L", "PNG")
    omit = ImageEncoderConfig(labels={"cat": 0}, unknown_label="omit")
    (record,) = encode_all(omit, [file_event(png, label="bird")]).records
    example = proto.parse_example(record)
    assert "image/class/label" not in example
    assert example["image/class/text"] == [b"bird"]
    (record,) = encode_all(ImageEncoderConfig(), [file_event(png, label="")]).records
    example = proto.parse_example(record)
    assert "image/class/label" not in example
    assert example["image/class/text"] == [b""]


def png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims ``width`` x ``height`` (a decompression bomb's header)."""
    data = bytearray(image_bytes("L", "PNG", (1, 1)))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", zlib.crc32(data[ihdr - 4 : ihdr + 13]))
    return bytes(data)


def test_images_over_the_pixel_cap_are_refused_from_the_header() -> None:
    capped = ImageEncoderConfig(max_pixels=100)
    result = encode_all(capped, [file_event(image_bytes("L", "PNG", (10, 10)))])
    assert len(result.records) == 1
    result = encode_all(capped, [file_event(image_bytes("L", "PNG", (11, 10)))])
    assert result.failures == [
        (
            0,
            "too-large",
            "feature 'image/encoded': 11x10 is 110 pixels, over max_pixels (100)",
        )
    ]
    bomb = encode_all(ImageEncoderConfig(), [file_event(png_claiming(100_000, 100_000))])
    assert [f[:2] for f in bomb.failures] == [(0, "too-large")]
    assert bomb.failures[0][2].startswith("feature 'image/encoded': ")


def test_image_config_refuses_unknown_formats_and_out_of_range_labels() -> None:
    with pytest.raises(ValueError, match=r"unknown image format\(s\) \['jpg'\]"):
        ImageEncoderConfig.model_validate({"formats": ["jpg"]})
    with pytest.raises(ValueError, match="label of 'cat' is outside int64"):
        ImageEncoderConfig.model_validate({"labels": {"cat": 2**63}})
    with pytest.raises(ValueError, match="unknown_label"):
        ImageEncoderConfig.model_validate({"unknown_label": "drop"})


# --- passthrough -------------------------------------------------------------------------------


def serialized_example() -> bytes:
    msg: Any = proto.Example()
    msg.features.feature["id"].int64_list.value.append(7)
    msg.features.feature["name"].bytes_list.value.append(b"x" * 200)
    msg.features.feature["xs"].float_list.value.extend([0.5, 1.5])
    data: bytes = msg.SerializeToString()
    return data


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: ``tag``, the varint length, ``payload``."""
    n, length = len(payload), bytearray()
    while n > 0x7F:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return bytes([tag]) + bytes(length) + payload


def example_of(entries: list[tuple[str, bytes]]) -> bytes:
    """An Example from ``(key, serialized Feature)`` entries, in this order."""
    features = b"".join(field(0x0A, field(0x0A, k.encode()) + field(0x12, v)) for k, v in entries)
    return field(0x0A, features)


def test_passthrough_writes_the_exact_bytes() -> None:
    data = serialized_example()
    # Not protobuf's canonical form (keys out of order, floats unpacked): kept as it is.
    unpacked_floats = field(
        0x12, b"\x0d" + struct.pack("<f", 0.5) + b"\x0d" + struct.pack("<f", 1.5)
    )
    reordered = example_of([("xs", unpacked_floats), ("id", b"\x1a\x03\x0a\x01\x07")])
    result = encode_all(PassthroughEncoderConfig(), [RawEvent(data, "a"), RawEvent(reordered, "b")])
    assert result.records == [data, reordered]
    assert proto.parse_example(reordered) == {"xs": [0.5, 1.5], "id": [7]}


def test_passthrough_refuses_what_does_not_parse_or_carries_unknown_fields() -> None:
    data = serialized_example()
    int64_feature = b"\x1a\x03\x0a\x01\x07"
    unknown_nested = example_of([("id", int64_feature + b"\x48\x01")])
    assert proto.parse_example(unknown_nested) == proto.parse_example(
        example_of([("id", int64_feature)])
    )
    sequence: Any = proto.SequenceExample()
    sequence.feature_lists.feature_list["t"].feature.add().int64_list.value.append(1)
    events = [
        RawEvent(data[:-3], "cut"),
        RawEvent(b'{"id": 7}', "json"),
        RawEvent(data + b"\x10\x01", "unknown at the top"),
        RawEvent(unknown_nested, "unknown in a Feature"),
        RawEvent(sequence.SerializeToString(), "a SequenceExample"),
        RawEvent(data, "good"),
    ]
    strict = encode_all(PassthroughEncoderConfig(), events)
    assert strict.records == [data]
    assert [(i, c) for i, c, _ in strict.failures] == [(i, "malformed") for i in range(5)]
    assert strict.failures[0][2] == "not an Example: length past the end of the message"
    assert strict.failures[2][2].startswith("not an Example: it parses, but holds fields")

    keep = encode_all(PassthroughEncoderConfig(unknown_fields="keep"), events)
    assert keep.records == [e.payload for e in events[2:]]


def test_a_key_that_is_not_utf8_is_kept_and_read_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TensorFlow reads such a key; ``keep`` accepts it and tfrecordd's reader reads it (protobuf
    alone refuses it), ``reject`` refuses it with its reason."""
    data = example_of([("id", b"\x1a\x03\x0a\x01\x07")]).replace(b"\x02id", b"\x02i\xff")
    assert proto.parse_example(data) == {"i\udcff": [7]}
    keep = encode_all(PassthroughEncoderConfig(unknown_fields="keep"), [RawEvent(data, "a")])
    assert keep.records == [data]
    strict = encode_all(PassthroughEncoderConfig(), [RawEvent(data, "a")])
    assert "is not UTF-8" in strict.failures[0][2]
    path = tmp_path / "a.tfrecord"
    with path.open("wb") as f:
        writer = RecordWriter(f.write, Compression.NONE)
        writer.write_many([data])
        writer.finish()
    assert main(["cat", str(path)]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"i\\xff": [7]}


def test_passthrough_sequence_examples() -> None:
    sequence: Any = proto.SequenceExample()
    sequence.context.feature["n"].int64_list.value.append(2)
    sequence.feature_lists.feature_list["t"].feature.add().bytes_list.value.append(b"a")
    data = sequence.SerializeToString()
    config = PassthroughEncoderConfig(message="sequence")
    result = encode_all(config, [RawEvent(data, "a"), RawEvent(data + b"\x18\x01", "b")])
    assert result.records == [data]
    assert result.failures[0][:2] == (1, "malformed")


def test_passthrough_cannot_describe_its_records() -> None:
    with pytest.raises(TfrecorddError, match="writes the records it is given unchanged"):
        PassthroughEncoderConfig().feature_description()


# --- a third-party encoder ---------------------------------------------------------------------


def documented_plugin() -> types.ModuleType:
    """The documented example plugin, as the module its package would install."""
    module = types.ModuleType("tfrecordd_wordcount")
    sys.modules[module.__name__] = module
    try:
        exec(
            compile(docs_block("custom-encoder-module"), "tfrecordd_wordcount.py", "exec"),
            vars(module),
        )
    finally:
        del sys.modules[module.__name__]
    return module


def test_documented_plugin_package_declares_its_entry_point() -> None:
    pyproject = tomllib.loads(docs_block("custom-encoder-pyproject"))
    entry = pyproject["project"]["entry-points"]["tfrecordd.encoders"]
    assert entry == {"wordcount": "tfrecordd_wordcount:WordCountConfig"}
    assert hasattr(documented_plugin(), "WordCountConfig")


def test_custom_encoder_from_a_registry_builds_and_encodes() -> None:
    plugin = documented_plugin()
    registry = Registry(
        sources={"directory": DirectorySourceConfig},
        encoders={"wordcount": plugin.WordCountConfig, "example": ExampleEncoderConfig},
    )
    data = {
        "output": {"dir": "/tmp/out"},
        "sources": [{"name": "s", "type": "directory", "path": "/tmp/in", "encoder": "lines"}],
        "encoders": {"lines": {"type": "wordcount", "lower": True}},
    }
    config = parse_config(data, registry)
    encoder_config = config.encoders["lines"]
    assert isinstance(encoder_config, plugin.WordCountConfig)
    result = encoder_config.build().encode_batch(
        [RawEvent(b"Hello big World", "a"), RawEvent(b"\xff", "b")]
    )
    assert [proto.parse_example(r) for r in result.records] == [
        {"words": [b"hello", b"big", b"world"], "count": [3]}
    ]
    assert [f[:2] for f in result.failures] == [(1, "malformed")]

    data["encoders"] = {"lines": {"type": "wordcount", "lowercase": True}}
    with pytest.raises(TfrecorddError, match=r"encoders\.lines\.lowercase: unknown key"):
        parse_config(data, registry)
