"""The image encoder's fast header path held to Pillow, and its records to ExampleWriter.

The fast path (``png_header``, ``jpeg_header``) must give exactly what Pillow's ``Image.open``
gives through the encoder (format, height, width, channels; or the same refusal, with the same
reason) on every file: the corpus below covers every PNG colour type and bit depth, palettes with
and without ``tRNS``, grayscale, RGB, CMYK and progressive JPEGs, EXIF (orientation included),
ICC profiles, MPO and damaged headers; then every header of the corpus is cut short and mutated
byte by byte, under the warning filters and Pillow settings that change what Pillow accepts.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image, ImageFile

from tfrecordd.errors import EncodeError
from tfrecordd.format import proto
from tfrecordd.format.wire import ExampleWriter
from tfrecordd.plugin import RawEvent
from tfrecordd_plugins.encoders import image
from tfrecordd_plugins.encoders.image import FEATURES, ImageEncoder, ImageEncoderConfig
from tfrecordd_plugins.encoders.image_headers import jpeg_header, png_header

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


def segments(jpeg: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, offset, end) of each segment up to the start of scan."""
    pos = 2
    while True:
        marker, length = jpeg[pos + 1], int.from_bytes(jpeg[pos + 2 : pos + 4], "big")
        yield marker, pos, pos + 2 + length
        if marker == 0xDA:
            return
        pos += 2 + length


def with_segment(jpeg: bytes, marker: int, body: bytes) -> bytes:
    """``jpeg`` with a segment inserted right after SOI."""
    return jpeg[:2] + bytes((0xFF, marker)) + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def without_segment(jpeg: bytes, marker: int) -> bytes:
    for m, start, end in segments(jpeg):
        if m == marker:
            return jpeg[:start] + jpeg[end:]
    raise AssertionError(f"no segment {marker:#x}")


def with_frame(jpeg: bytes, components: int, extra: bytes = b"") -> bytes:
    """``jpeg`` with its frame header declaring ``components`` components, then ``extra``."""
    for marker, start, end in segments(jpeg):
        if marker == 0xC0:
            body = jpeg[start + 4 : start + 10] + jpeg[start + 10 : start + 13] * components
            body = body[:5] + bytes((components,)) + body[6:] + extra
            return jpeg[:start] + b"\xff\xc0" + struct.pack(">H", len(body) + 2) + body + jpeg[end:]
    raise AssertionError("no SOF0")


def exif(orientation: int) -> bytes:
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags.tobytes()


def jfif(unit: int) -> bytes:
    return b"JFIF\x00\x01\x02" + bytes((unit,)) + struct.pack(">HH", 300, 300) + b"\x00\x00"


def apng() -> bytes:
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (7, 5), c) for c in ("red", "blue")]
    frames[0].save(buffer, "PNG", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def mpo() -> bytes:
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (7, 5), c) for c in ("red", "blue")]
    frames[0].save(buffer, "MPO", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def png_text() -> bytes:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("k", "v")
    return saved("RGB", "PNG", pnginfo=info)


# (name, file, whether the fast path reads it, expected (format, width, height, channels) or None)
CORPUS: list[tuple[str, bytes, bool, tuple[str, int, int, int] | None]] = [
    # Every PNG colour type and bit depth; the channels are Pillow's mode's.
    ("png gray 1-bit", png(1, 0), True, ("png", 7, 5, 1)),
    ("png gray 2-bit", png(2, 0), True, ("png", 7, 5, 1)),
    ("png gray 4-bit", png(4, 0), True, ("png", 7, 5, 1)),
    ("png gray 8-bit", png(8, 0), True, ("png", 7, 5, 1)),
    ("png gray 16-bit", png(16, 0), True, ("png", 7, 5, 1)),
    ("png rgb 8-bit", png(8, 2), True, ("png", 7, 5, 3)),
    ("png rgb 16-bit", png(16, 2), True, ("png", 7, 5, 3)),
    ("png palette 1-bit", png(1, 3), True, ("png", 7, 5, 3)),
    ("png palette 2-bit", png(2, 3), True, ("png", 7, 5, 3)),
    ("png palette 4-bit", png(4, 3), True, ("png", 7, 5, 3)),
    ("png palette 8-bit", png(8, 3), True, ("png", 7, 5, 3)),
    ("png gray+alpha 8-bit", png(8, 4), True, ("png", 7, 5, 2)),
    # Pillow opens 16-bit grey with alpha as RGBA; TensorFlow decodes it to 2 channels.
    ("png gray+alpha 16-bit", png(16, 4), True, ("png", 7, 5, 2)),
    ("png rgba 8-bit", png(8, 6), True, ("png", 7, 5, 4)),
    ("png rgba 16-bit", png(16, 6), True, ("png", 7, 5, 4)),
    ("png interlaced", png(8, 2, interlace=1), True, ("png", 7, 5, 3)),
    ("png rgb 3-bit: no such PNG", png(4, 2), False, None),
    # Transparency: any tRNS makes a palette RGBA (even one saying every entry is opaque); in other
    # modes it changes nothing, unless too short for Pillow; after IDAT Pillow does not see it.
    ("png palette, one transparent entry", png(8, 3, chunk(b"tRNS", b"\xff\x00")), True, None),
    ("png palette, alpha per entry", png(4, 3, chunk(b"tRNS", bytes([0, 128, 255]))), True, None),
    ("png palette, tRNS all opaque", png(8, 3, chunk(b"tRNS", b"\xff\xff\xff")), True, None),
    ("png palette, empty tRNS", png(2, 3, chunk(b"tRNS", b"")), True, None),
    ("png palette, tRNS after IDAT", png(8, 3, after_idat=(chunk(b"tRNS", b"\x00"),)), True, None),
    ("png 1-bit gray, tRNS", png(1, 0, chunk(b"tRNS", b"\x00\x01")), True, ("png", 7, 5, 1)),
    ("png gray, tRNS", png(8, 0, chunk(b"tRNS", b"\x00\x07")), True, ("png", 7, 5, 1)),
    ("png gray 16-bit, tRNS", png(16, 0, chunk(b"tRNS", b"\x01\x07")), True, None),
    ("png gray, short tRNS", png(8, 0, chunk(b"tRNS", b"\x07")), False, None),
    ("png rgb, tRNS", png(8, 2, chunk(b"tRNS", bytes(6))), True, ("png", 7, 5, 3)),
    ("png rgb, short tRNS", png(8, 2, chunk(b"tRNS", bytes(4))), False, None),
    ("png rgba, tRNS ignored", png(8, 6, chunk(b"tRNS", b"")), True, ("png", 7, 5, 4)),
    ("png gray+alpha, tRNS ignored", png(8, 4, chunk(b"tRNS", b"")), True, ("png", 7, 5, 2)),
    # Chunks Pillow only stores from, unknown chunks, and chunks left to Pillow.
    (
        "png gAMA cHRM sRGB pHYs",
        png(
            8,
            2,
            chunk(b"gAMA", bytes(4)),
            chunk(b"cHRM", bytes(32)),
            chunk(b"sRGB", b"\x00"),
            chunk(b"pHYs", bytes(9)),
        ),
        True,
        ("png", 7, 5, 3),
    ),
    ("png short pHYs", png(8, 2, chunk(b"pHYs", bytes(8))), False, None),
    ("png short gAMA", png(8, 2, chunk(b"gAMA", bytes(3))), False, None),
    ("png private chunk", png(8, 2, chunk(b"prVt", b"anything")), True, ("png", 7, 5, 3)),
    ("png bad chunk type", png(8, 2, chunk(b"a b!", b"")), False, None),
    ("png tEXt", png_text(), False, ("png", 7, 5, 3)),
    ("png iCCP", saved("RGB", "PNG", icc_profile=b"not a real profile"), False, None),
    ("png eXIf", saved("RGB", "PNG", exif=exif(6)), False, ("png", 7, 5, 3)),
    ("png APNG", apng(), False, ("png", 7, 5, 3)),
    ("png IEND before IDAT", PNG_MAGIC + png(8, 2)[8:33] + chunk(b"IEND", b""), False, None),
    ("png second IHDR", png(8, 2, png(8, 0)[8:33]), False, None),
    ("png zero width", png(8, 2, size=(0, 5)), False, None),
    ("png no IDAT", png(8, 2)[: -len(chunk(b"IEND", b""))][:33], False, None),
    # Pillow's own PNGs.
    ("pillow png 1", saved("1", "PNG"), True, ("png", 7, 5, 1)),
    ("pillow png I;16", saved("I;16", "PNG"), True, ("png", 7, 5, 1)),
    ("pillow png P 2-bit", saved("P", "PNG", bits=2), True, ("png", 7, 5, 3)),
    ("pillow png P transparency", saved("P", "PNG", transparency=3), True, ("png", 7, 5, 4)),
    ("pillow png L transparency", saved("L", "PNG", transparency=3), True, ("png", 7, 5, 1)),
    ("pillow png dpi", saved("RGBA", "PNG", dpi=(300, 300)), True, ("png", 7, 5, 4)),
    ("pillow png large", saved("RGB", "PNG", size=(640, 480)), True, ("png", 640, 480, 3)),
    # JPEGs: the channels are what TensorFlow decodes: 1 for gray, else 3 (CMYK too).
    ("jpeg gray", saved("L", "JPEG"), True, ("jpeg", 7, 5, 1)),
    ("jpeg rgb", saved("RGB", "JPEG"), True, ("jpeg", 7, 5, 3)),
    ("jpeg cmyk (Adobe APP14)", saved("CMYK", "JPEG"), True, ("jpeg", 7, 5, 3)),
    ("jpeg progressive", saved("RGB", "JPEG", progressive=True), True, ("jpeg", 7, 5, 3)),
    ("jpeg gray progressive", saved("L", "JPEG", progressive=True), True, ("jpeg", 7, 5, 1)),
    ("jpeg optimized 4:4:4", saved("RGB", "JPEG", optimize=True, subsampling=0), True, None),
    ("jpeg 16-bit tables", saved("L", "JPEG", qtables=[[300] * 64]), True, ("jpeg", 7, 5, 1)),
    ("jpeg large", saved("RGB", "JPEG", size=(640, 480)), True, ("jpeg", 640, 480, 3)),
    ("jpeg restart interval", saved("RGB", "JPEG", restart_marker_blocks=1), True, None),
    ("jpeg comment", saved("RGB", "JPEG", comment=b"a comment"), True, None),
    ("jpeg XMP", saved("RGB", "JPEG", xmp=b"<x:xmpmeta/>"), True, None),
    ("jpeg ICC", saved("RGB", "JPEG", icc_profile=b"p" * 300), True, None),
    ("jpeg no JFIF", without_segment(saved("RGB", "JPEG"), 0xE0), True, ("jpeg", 7, 5, 3)),
    ("jpeg JFIF in cm", with_segment(saved("L", "JPEG"), 0xE0, jfif(2)), True, None),
    # EXIF orientation: the size is the stored one, never turned (7x5 stays 7x5). With a JFIF
    # resolution Pillow does not parse the EXIF; without, it does, so the file is Pillow's.
    ("jpeg EXIF orientation 6", saved("RGB", "JPEG", exif=exif(6)), False, ("jpeg", 7, 5, 3)),
    (
        "jpeg EXIF orientation 6, dpi",
        saved("RGB", "JPEG", exif=exif(6), dpi=(72, 72)),
        True,
        ("jpeg", 7, 5, 3),
    ),
    (
        "jpeg EXIF, dpi in cm",
        with_segment(saved("RGB", "JPEG", exif=exif(3)), 0xE0, jfif(2)),
        True,
        ("jpeg", 7, 5, 3),
    ),
    (
        "jpeg EXIF, JFIF too short for a density",
        with_segment(saved("RGB", "JPEG", exif=exif(3)), 0xE0, jfif(1)[:11]),
        False,
        ("jpeg", 7, 5, 3),
    ),
    (
        "jpeg EXIF orientation 8, dpi, no JFIF",
        without_segment(saved("RGB", "JPEG", exif=exif(8), dpi=(72, 72)), 0xE0),
        False,
        ("jpeg", 7, 5, 3),
    ),
    (
        "jpeg damaged EXIF",
        with_segment(saved("RGB", "JPEG"), 0xE1, b"Exif\x00\x00MM\x00*"),
        False,
        None,
    ),
    ("jpeg MPO", mpo(), False, ("jpeg", 7, 5, 3)),
    (
        "jpeg Photoshop APP13",
        with_segment(saved("RGB", "JPEG"), 0xED, b"Photoshop 3.0\x008BIM"),
        False,
        None,
    ),
    ("jpeg short Adobe APP14", with_segment(saved("RGB", "JPEG"), 0xEE, b"Adobe"), False, None),
    ("jpeg short JFIF", with_segment(saved("RGB", "JPEG"), 0xE0, b"JFIF\x00"), False, None),
    ("jpeg short ICC", with_segment(saved("RGB", "JPEG"), 0xE2, b"ICC_PROFILE\x00"), False, None),
    ("jpeg fill byte", saved("RGB", "JPEG")[:2] + b"\xff" + saved("RGB", "JPEG")[2:], False, None),
    ("jpeg 2 components", with_frame(saved("L", "JPEG"), 2), False, None),
    ("jpeg frame header, 1 byte more", with_frame(saved("L", "JPEG"), 1, b"\x00"), False, None),
    # Pillow reads a frame header 3 bytes too long as one with a component more; left to it.
    (
        "jpeg frame header, 3 bytes more",
        with_frame(saved("L", "JPEG"), 1, b"\x02\x11\x00"),
        False,
        ("jpeg", 7, 5, 1),
    ),
    # Not JPEG or PNG at all: Pillow's.
    ("gif", saved("P", "GIF"), False, ("gif", 7, 5, 3)),
    ("webp", saved("RGBA", "WEBP", lossless=True), False, ("webp", 7, 5, 4)),
    ("bmp", saved("RGB", "BMP"), False, ("bmp", 7, 5, 3)),
    ("nothing", b"", False, None),
    ("text", b"not an image at all", False, None),
]
IDS = [name for name, *_ in CORPUS]


def pillow_only(config: ImageEncoderConfig | None = None) -> ImageEncoder:
    """The encoder as it was before the fast path: every header read by Pillow."""
    encoder = (config or ImageEncoderConfig()).build()
    encoder.fast_jpeg = encoder.fast_png = False
    return encoder


def outcome(encoder: ImageEncoder, data: bytes) -> object:
    """What the encoder makes of a file's header: its findings, or its refusal and reason."""
    try:
        return encoder.header(data)
    except Exception as e:
        return type(e).__name__, getattr(e, "category", None), str(e)


def fast_header(data: bytes) -> tuple[int, int, int] | None:
    return png_header(data) if data.startswith(PNG_MAGIC) else jpeg_header(data)


@pytest.mark.parametrize(("name", "data", "fast", "expected"), CORPUS, ids=IDS)
def test_the_fast_path_reads_what_pillow_reads(
    name: str, data: bytes, fast: bool, expected: tuple[str, int, int, int] | None
) -> None:
    reference = outcome(pillow_only(), data)
    assert outcome(ImageEncoderConfig().build(), data) == reference
    found = fast_header(data)
    assert (found is not None) == fast, "the fast path reads it" if fast else "Pillow reads it"
    if found is not None:
        fmt = "png" if data.startswith(PNG_MAGIC) else "jpeg"
        assert reference == (fmt, *found)
    if expected is not None:
        assert reference == expected


def test_palette_channels_follow_transparency() -> None:
    """The semantics the corpus holds the fast path to, spelled out."""
    encoder = ImageEncoderConfig().build()
    assert encoder.header(png(8, 3)) == ("png", 7, 5, 3)
    assert encoder.header(png(8, 3, chunk(b"tRNS", b"\xff\x00"))) == ("png", 7, 5, 4)
    assert encoder.header(png(8, 3, chunk(b"tRNS", b"\xff\xff"))) == ("png", 7, 5, 4)
    assert encoder.header(png(8, 3, after_idat=(chunk(b"tRNS", b"\x00"),))) == ("png", 7, 5, 3)
    assert encoder.header(png(16, 4)) == ("png", 7, 5, 2)  # RGBA to Pillow, 2 to TensorFlow
    turned = saved("RGB", "JPEG", size=(40, 30), exif=exif(6), dpi=(72, 72))
    assert jpeg_header(turned) == (40, 30, 3)
    assert encoder.header(turned) == ("jpeg", 40, 30, 3)


def header_offsets(data: bytes) -> list[int]:
    """The offsets of the bytes that decide the header, and a few past them: all of a PNG's up
    to its first IDAT's data; of a JPEG's segments, up to the start of scan, the first 16 bytes
    and the last 2 of each (markers, lengths, the fields Pillow reads; not the middle of Huffman
    or quantization tables, which Pillow reads past)."""
    if data.startswith(PNG_MAGIC):
        end = data.index(b"IDAT") + 4
        return list(range(min(end + 8, len(data))))
    offsets = {0, 1}
    for _, start, end in segments(data):
        offsets.update(i for i in range(start, end) if i - start < 16 or end - i <= 2)
    last = max(offsets)
    offsets.update(range(last, min(last + 8, len(data))))
    return sorted(offsets)


def variants(data: bytes) -> Iterator[bytes]:
    """The file cut at, and with one byte changed at, each of its header's offsets."""
    for i in header_offsets(data):
        yield data[:i]
        for change in (lambda b: b ^ 0xFF, lambda b: 0, lambda b: (b + 1) & 0xFF):
            yield data[:i] + bytes((change(data[i]),)) + data[i + 1 :]


MUTATED = [(name, data) for name, data, fast, _ in CORPUS if fast and len(data) < 4096]


@pytest.mark.parametrize(
    ("warning_filter", "load_truncated"), [("error", False), ("ignore", False), ("ignore", True)]
)
def test_damaged_headers_get_the_same_answer_either_way(
    warning_filter: Any, load_truncated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)
    fast, slow = ImageEncoderConfig().build(), pillow_only()
    read_fast = 0
    with warnings.catch_warnings():
        warnings.simplefilter(warning_filter)
        for name, data in MUTATED:
            for variant in variants(data):
                expected = outcome(slow, variant)
                assert outcome(fast, variant) == expected, (name, variant)
                read_fast += fast_header(variant) is not None
    assert read_fast > 1000  # the fast path did answer for many of the variants


def test_over_pillows_pixel_limit_pillow_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    for data in (saved("RGB", "JPEG", size=(40, 30)), png(8, 2, size=(40, 30))):
        assert fast_header(data) == (40, 30, 3)
        for limit in (40 * 30, 40 * 30 - 1, (40 * 30 - 1) // 2):
            monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
            for warning_filter in ("error", "ignore"):
                with warnings.catch_warnings():
                    warnings.simplefilter(warning_filter)
                    expected = outcome(pillow_only(), data)
                    assert outcome(ImageEncoderConfig().build(), data) == expected


def test_the_fast_path_only_where_pillow_would_try_that_format_first() -> None:
    def fast(formats: list[str]) -> tuple[bool, bool]:
        encoder = ImageEncoderConfig(formats=formats).build()
        return encoder.fast_jpeg, encoder.fast_png

    assert fast(["jpeg", "png", "gif", "bmp", "webp"]) == (True, True)
    assert fast(["gif", "png"]) == (False, True)
    assert fast(["webp"]) == (False, False)
    # Only formats known to refuse a JPEG's or a PNG's magic may come first; after any other
    # (TGA's reader, say, has no magic to check), Pillow reads.
    assert fast(["png", "tiff", "jpeg"]) == (False, True)
    assert fast(["tga", "jpeg", "png"]) == (False, False)
    png_only = ImageEncoderConfig(formats=["png"]).build()
    assert outcome(png_only, saved("RGB", "JPEG")) == outcome(
        pillow_only(ImageEncoderConfig(formats=["png"])), saved("RGB", "JPEG")
    )


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
    monkeypatch.setattr(image, "CACHED", 3)
    writer = ExampleWriter(list(FEATURES))
    encoder = ImageEncoderConfig(labels={"a": 0, "b": 1}, unknown_label="omit").build()
    files = [png(8, c, size=(w, h)) for c in (0, 2, 6) for w, h in ((1, 1), (2, 1), (1, 2), (2, 2))]
    events = [event(f, f"{i}.png", label) for i, f in enumerate(files) for label in "abcd"]
    for ev in events + events[::-1]:
        assert encoder.encode(ev) == writer.encode(encoder.values(ev))
        assert len(encoder.before_cache) <= 3
        assert len(encoder.after_cache) <= 3


def test_a_folder_that_is_not_text_is_refused_as_before() -> None:
    data = png(8, 2)
    for encoder in (ImageEncoderConfig().build(), pillow_only()):
        with pytest.raises(EncodeError, match="image/class/text"):
            encoder.encode(event(data, label=5))
