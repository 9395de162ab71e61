"""The image encoder's records, held to ExampleWriter byte for byte."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import pytest
from PIL import Image

from tfrecordd import proto
from tfrecordd.errors import EncodeError
from tfrecordd.plugin import RawEvent
from tfrecordd.wire import ExampleWriter
from tfrecordd_plugins.encoders import image
from tfrecordd_plugins.encoders.image import FEATURES, ImageEncoderConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- building the corpus -----------------------------------------------------------------------


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
"""PNG colour type → samples per pixel."""


def png(
    depth: int,
    colour: int,
    *extra: bytes,
    after_idat: tuple[bytes, ...] = (),
    size: tuple[int, int] = (7, 5),
    interlace: int = 0,
) -> bytes:
    """A PNG written chunk by chunk: IHDR, a palette for colour type 3, ``extra``, IDAT,
    ``after_idat``, IEND."""
    width, height = size
    row = (width * SAMPLES[colour] * depth + 7) // 8
    pixels = zlib.compress(b"".join(b"\x00" + bytes(row) for _ in range(height)))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    palette = [chunk(b"PLTE", bytes(i % 256 for i in range(3 * 2**depth)))] if colour == 3 else []
    return PNG_MAGIC + b"".join(
        [
            chunk(b"IHDR", ihdr),
            *palette,
            *extra,
            chunk(b"IDAT", pixels),
            *after_idat,
            chunk(b"IEND", b""),
        ]
    )


def saved(mode: str, fmt: str, size: tuple[int, int] = (7, 5), **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format=fmt, **options)
    return buffer.getvalue()


# --- records -----------------------------------------------------------------------------------


def event(data: bytes, filename: str = "a.png", label: Any = "cat") -> RawEvent:
    return RawEvent(
        data, f"spool/{label}/{filename}", {"filename": filename, "label": label}, "file"
    )


CONFIGS = [
    ImageEncoderConfig(check_complete=False),
    ImageEncoderConfig(labels={"cat": 3, "dog": 2**40}, check_complete=False),
    ImageEncoderConfig(labels={"dog": 1}, unknown_label="omit", check_complete=False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["no labels", "labels", "omit"])
def test_records_are_what_example_writer_writes(config: ImageEncoderConfig) -> None:
    writer = ExampleWriter(list(FEATURES))
    encoder = config.build()
    small = png(8, 0, size=(1, 1))
    jpeg = saved("RGB", "JPEG", size=(33, 17))
    files = [png(1, 0), png(16, 4), png(4, 3), saved("L", "JPEG"), saved("CMYK", "JPEG")]
    events = [event(data, f"{n}.jpg", "cat") for n, data in enumerate(files)]
    events += [event(jpeg, "x" * 200, "dog"), event(jpeg, "é.jpg", "cat"), event(jpeg, "", "cat")]
    if not config.labels or config.unknown_label == "omit":
        events.append(event(jpeg, "no folder.jpg", ""))
    # File sizes on both sides of every varint length the entry's four lengths can take.
    for boundary in (128, 1 << 14, 1 << 21):
        for n in range(boundary - 24, boundary + 2):
            events.append(event(small + bytes(n - len(small)), f"{n}.png"))
    result = encoder.encode_batch(events)
    assert result.failures == []
    assert len(result.records) == len(events)
    for ev, record in zip(events, result.records, strict=True):
        assert record == writer.encode(encoder.values(ev))
        assert proto.parse_example(record)["image/encoded"] == [ev.payload]


def test_cached_entries_change_with_what_they_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "_CACHED", 3)
    writer = ExampleWriter(list(FEATURES))
    encoder = ImageEncoderConfig(labels={"a": 0, "b": 1}, unknown_label="omit").build()
    files = [png(8, c, size=(w, h)) for c in (0, 2, 6) for w, h in ((1, 1), (2, 1), (1, 2), (2, 2))]
    events = [event(f, f"{i}.png", label) for i, f in enumerate(files) for label in "abcd"]
    for ev in events + events[::-1]:
        assert encoder.encode(ev) == writer.encode(encoder.values(ev))
        assert len(encoder._before_cache) <= 3
        assert len(encoder._after_cache) <= 3


def test_a_folder_that_is_not_text_is_refused_as_before() -> None:
    data = png(8, 2)
    with pytest.raises(EncodeError, match="image/class/text"):
        ImageEncoderConfig().build().encode(event(data, label=5))
