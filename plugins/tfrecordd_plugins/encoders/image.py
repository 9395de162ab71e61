"""``type = "image"``: whole image files to ``tf.train.Example``, the way TensorFlow's image models
read them.

The features follow the names of TensorFlow's image pipelines (Inception's ``build_image_data``,
the object detection API, TF-Slim): ``image/encoded`` holds the file's bytes as they are (never
re-encoded), ``image/format`` the format in lower case (``b"jpeg"``, ``b"png"``...),
``image/height``, ``image/width`` and ``image/channels`` the size read from the file's header
(the channels as ``tf.io.decode_image`` decodes the file, so a reshape by them holds),
``image/filename`` the file's name, ``image/class/text`` the name of its parent folder and
``image/class/label`` that name's number in the configured ``labels``.

Only the header is read: no pixel is decoded, so a file costs little whatever its size, and a
decompression bomb costs nothing but a refusal. Pillow's ``Image.open`` is the reader of headers.
For the two commonest formats a fast path comes first: :func:`png_header` and :func:`jpeg_header`
walk a PNG's chunks up to the first ``IDAT`` and a JPEG's segments up to the start of scan, about
ten times faster than ``Image.open`` (whose JPEG reader also unpacks every quantization table).
They answer only for files they are sure Pillow reads the same way, with the same format, size
and channels, and return ``None`` for everything else, which Pillow then reads as before: any
chunk or segment Pillow handles that they do not (APNG, iCCP and text chunks, MPO's ``MPF``,
Photoshop's ``APP13``...), a checksum or length that does not add up, an EXIF block Pillow would
parse for its resolution, an image over ``PIL.Image.MAX_IMAGE_PIXELS``. So every refusal, with
its reason, is still Pillow's. ``tests/unit/test_image_encoder.py`` holds them to Pillow on PNGs
of every colour type and bit depth (palettes with and without ``tRNS``), on grayscale, RGB,
CMYK and progressive JPEGs, with and without EXIF (orientation included: the size is the stored
one, never rotated, as Pillow's header gives it), and on damaged files.

The record is written with one copy of the file's bytes (:meth:`ImageEncoder.encode` joins the
small features' entries around them), byte for byte what
:class:`~tfrecordd.format.wire.ExampleWriter` writes for the same features.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Sequence
from typing import Any, Literal

import pydantic
from PIL import Image, PngImagePlugin, UnidentifiedImageError

from tfrecordd.format.wire import (
    INT64_MAX,
    INT64_MIN,
    BytesEntryHead,
    ExampleWriter,
    FeatureType,
    example_head,
    map_entries,
)
from tfrecordd.plugin import (
    EncodeError,
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
    TfrecorddError,
)

__all__ = [
    "ImageEncoder",
    "ImageEncoderConfig",
    "bmp_channels",
    "channels_of",
    "jpeg_header",
    "png_channels",
    "png_header",
]

DEFAULT_FORMATS = ("jpeg", "png", "gif", "bmp", "webp")
PILLOW_MAX_IMAGE_PIXELS = 89_478_485
"""Pillow's own default for ``Image.MAX_IMAGE_PIXELS`` (a 3 GiB RGBA bitmap / 4 / 3)."""

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
FILENAME = "image/filename"
LABEL = "image/class/label"
TEXT = "image/class/text"

FEATURES = (
    (ENCODED, FeatureType.BYTES),
    (FORMAT, FeatureType.BYTES),
    (HEIGHT, FeatureType.INT64),
    (WIDTH, FeatureType.INT64),
    (CHANNELS, FeatureType.INT64),
    (FILENAME, FeatureType.BYTES),
    (TEXT, FeatureType.BYTES),
    (LABEL, FeatureType.INT64),
)
"""The features of a record, in the order :meth:`ImageEncoder.values` gives their values."""

_ONE_CHANNEL = frozenset({"1", "L", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
_TWO_CHANNELS = frozenset({"LA", "La"})
_THREE_CHANNELS = frozenset({"RGB", "YCbCr", "LAB", "HSV"})
_FOUR_CHANNELS = frozenset({"RGBA", "RGBa", "RGBX", "CMYK", "PA"})


def _pillow_formats() -> frozenset[str]:
    Image.init()
    return frozenset(f.lower() for f in Image.OPEN)


def _mode_channels(mode: str) -> int | None:
    """The channels of a Pillow mode other than ``P``, if it is one of the known ones."""
    if mode in _ONE_CHANNEL:
        return 1
    if mode in _TWO_CHANNELS:
        return 2
    if mode in _THREE_CHANNELS:
        return 3
    if mode in _FOUR_CHANNELS:
        return 4
    return None


def channels_of(image: Image.Image) -> int:
    """The channels ``tf.io.decode_image(channels=0)`` gives, where TensorFlow decodes the
    format (else what Pillow's ``convert`` of a palette gives): a palette counts as the RGB, or
    RGBA if it has transparency, it expands to; a GIF always decodes to RGB; a JPEG to one
    channel if it is gray, else three (a CMYK JPEG too: TensorFlow converts it to RGB). A BMP's
    or a PNG's channels depend on what the image does not tell (bits per pixel, colour type):
    see :func:`bmp_channels` and :func:`png_channels`."""
    mode = image.mode
    if image.format == "GIF":
        return 3
    if image.format in ("JPEG", "MPO"):
        return 1 if mode == "L" else 3
    if mode == "P":
        return 4 if "transparency" in image.info else 3
    channels = _mode_channels(mode)
    return len(image.getbands()) if channels is None else channels


_BMP_CHANNELS = {8: 1, 24: 3, 32: 4}
"""Bits per pixel → channels, as TensorFlow's ``decode_bmp`` decodes them: it reads 8-bit
pixels as one gray channel, whatever the palette, and the fourth byte of 32-bit ones as alpha."""


_PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
"""PNG colour type → channels, as ``tf.io.decode_png`` decodes them (palettes, type 3, by
transparency)."""


def png_channels(data: bytes, pillow_channels: int) -> int:
    """The channels ``tf.io.decode_png`` gives for a PNG, from its colour type; for a palette
    (RGB, or RGBA with transparency) or a file without the usual IHDR, Pillow's count."""
    if len(data) < 26 or data[12:16] != b"IHDR":
        return pillow_channels
    return _PNG_CHANNELS.get(data[25], pillow_channels)


def bmp_channels(data: bytes, pillow_channels: int) -> int:
    """The channels ``tf.io.decode_bmp`` gives for a BMP, from its bits per pixel; for depths it
    cannot decode (1, 4 or 16 bits), Pillow's count."""
    if len(data) < 30 or not data.startswith(b"BM"):
        return pillow_channels
    header_size = _U32LE(data, 14)[0]
    bits = _U16LE(data, 24 if header_size == 12 else 28)[0]
    return _BMP_CHANNELS.get(bits, pillow_channels)


# --- the fast path: PNG and JPEG headers as Pillow reads them ----------------------------------
#
# Each check below mirrors a step of Pillow's PngImagePlugin / JpegImagePlugin ``_open``; wherever
# Pillow could raise, warn, or read the file in a way not mirrored here, the fast path answers
# None and Pillow reads the file.

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
_U32 = struct.Struct(">I").unpack_from
_U32LE = struct.Struct("<I").unpack_from
_U16LE = struct.Struct("<H").unpack_from
_CHUNK_HEAD = struct.Struct(">I4s").unpack_from
_IHDR = struct.Struct(">IIBBBBB").unpack_from
_SEGMENT_HEAD = struct.Struct(">BBH").unpack_from
_SOF = struct.Struct(">BHHB").unpack_from
_crc32 = zlib.crc32
_is_chunk_type = re.compile(rb"\w\w\w\w").match
"""Pillow's own test of a chunk type (``PngImagePlugin.is_cid``)."""


def _png_modes() -> dict[tuple[int, int], tuple[str, int]]:
    """(bit depth, colour type) → (Pillow's mode, channels without ``tRNS``), from Pillow's own
    table, the channels by colour type as ``tf.io.decode_png`` decodes them (a 16-bit
    grey-with-alpha PNG is RGBA to Pillow, but 2 channels to TensorFlow). Empty (no PNG fast
    path) if this Pillow has no such table or no ``PngStream`` to list its chunk readers."""
    table = getattr(PngImagePlugin, "_MODES", None)
    out: dict[tuple[int, int], tuple[str, int]] = {}
    if not isinstance(table, dict) or not hasattr(PngImagePlugin, "PngStream"):
        return out
    for key, value in table.items():
        mode = value[0]
        if mode == "P" or _mode_channels(mode) is not None:
            out[key] = (mode, _PNG_CHANNELS.get(key[1], 3))
    return out


_PNG_MODES = _png_modes()
_PNG_PILLOW_CHUNKS = frozenset(
    name[len("chunk_") :].encode()
    for name in dir(getattr(PngImagePlugin, "PngStream", None))
    if name.startswith("chunk_")
)
"""Chunk types Pillow has a reader for: but for those below, they send a file to Pillow."""
_PNG_MIN_LENGTH = {b"PLTE": 0, b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}
"""Chunks Pillow only stores something from (never the mode or size), and the length below
which it raises instead."""
_PNG_TRNS_MIN_LENGTH = {"1": 2, "L": 2, "I;16": 2, "RGB": 6}
"""Pillow raises on a ``tRNS`` shorter than this in these modes; it ignores ``tRNS`` in the
others, but for ``P``, where any ``tRNS`` means transparency."""


def png_header(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, channels) of a PNG, exactly as Pillow's header and :func:`channels_of`
    give them, or ``None`` when the file is not a PNG this fast path is sure of."""
    n = len(data)
    if n < 41 or not data.startswith(_PNG_MAGIC) or _CHUNK_HEAD(data, 8) != (13, b"IHDR"):
        return None
    view = memoryview(data)
    if _crc32(view[12:29]) != _U32(data, 29)[0]:
        return None
    width, height, depth, colour, _, filter_method, _ = _IHDR(data, 16)
    known = _PNG_MODES.get((depth, colour))
    if known is None or filter_method or not width or not height:
        return None
    mode, channels = known
    trns_min = _PNG_TRNS_MIN_LENGTH.get(mode)
    pos = 33
    while pos + 8 <= n:
        length, kind = _CHUNK_HEAD(data, pos)
        if kind == b"IDAT":
            return width, height, channels
        end = pos + 12 + length
        if end > n or _crc32(view[pos + 4 : end - 4]) != _U32(data, end - 4)[0]:
            return None
        if kind == b"tRNS":
            if mode == "P":
                channels = 4
            elif trns_min is not None and length < trns_min:
                return None
        elif kind in _PNG_MIN_LENGTH:
            if length < _PNG_MIN_LENGTH[kind]:
                return None
        elif kind in _PNG_PILLOW_CHUNKS or _is_chunk_type(kind) is None:
            # IHDR again, IEND before any IDAT, APNG, text, ICC, EXIF...: Pillow's to read.
            return None
        pos = end
    return None


_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2})
"""Baseline, extended and progressive: the start-of-frame markers the fast path reads."""
_JPEG_SKIPPED = frozenset({0xC4, 0xDD, 0xFE})
"""Huffman tables, restart interval, comment: segments Pillow reads past."""


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, channels) of a JPEG, exactly as Pillow's header and :func:`channels_of`
    give them, or ``None`` when the file is not a JPEG this fast path is sure of.

    The size is the one stored in the frame header, never turned by an EXIF orientation, as
    Pillow's ``Image.open`` gives it; channels are 1 for a frame of one component, else 3, as
    ``tf.io.decode_jpeg`` decodes it (a CMYK frame too). A JPEG with EXIF but no JFIF
    resolution goes to Pillow, which parses that EXIF for the resolution at open and refuses
    some files whose EXIF is damaged."""
    n = len(data)
    if not data.startswith(_JPEG_MAGIC):
        return None
    frame: tuple[int, int, int] | None = None
    exif = dpi = False
    pos = 2
    while pos + 4 <= n:
        ff, marker, length = _SEGMENT_HEAD(data, pos)
        start = pos + 4
        pos += 2 + length
        if ff != 0xFF or length < 2 or pos > n:
            return None
        if marker == 0xDA:  # start of scan: the header is over
            return None if exif and not dpi else frame
        if marker in _JPEG_SKIPPED:
            continue
        size = pos - start
        if marker == 0xDB:  # quantization tables: Pillow checks each one's length
            while start < pos:
                start += 65 if data[start] < 16 else 129
            if start > pos:
                return None
        elif marker in _JPEG_SOF:
            if frame is not None or size < 6:
                return None
            bits, height, width, components = _SOF(data, start)
            if (
                bits != 8
                or components not in (1, 3, 4)
                or size != 6 + 3 * components
                or not width
                or not height
            ):
                return None
            frame = (width, height, 1 if components == 1 else 3)
        elif 0xE0 <= marker <= 0xEF:
            if marker == 0xE0:
                if data.startswith(b"JFIF", start, pos):
                    if size < 7:
                        return None
                    if size >= 12 and data[start + 7] in (1, 2):
                        dpi = True
            elif marker == 0xE1:
                if data.startswith(b"Exif\x00\x00", start, pos):
                    exif = True
            elif marker == 0xE2:
                if data.startswith(b"MPF\x00", start, pos) or (
                    size < 14 and data.startswith(b"ICC_PROFILE\x00", start, pos)
                ):
                    return None
            elif marker == 0xED:
                if data.startswith(b"Photoshop 3.0\x00", start, pos):
                    return None
            elif marker == 0xEE and size < 7 and data.startswith(b"Adobe", start, pos):
                return None
        else:
            return None
    return None


_DISJOINT_MAGIC = frozenset({"JPEG", "PNG", "GIF", "BMP", "WEBP"})
"""Formats whose Pillow readers accept only their own magic bytes, none of which a PNG or a
JPEG starts with."""


def _has_fast_path(pillow_formats: Sequence[str], name: str) -> bool:
    """Whether ``Image.open(..., formats=pillow_formats)`` hands a file with the magic of
    ``name`` (JPEG or PNG) to that format's reader first: no reader before it could take it."""
    if name not in pillow_formats or (name == "PNG" and not _PNG_MODES):
        return False
    return all(f in _DISJOINT_MAGIC for f in pillow_formats[: pillow_formats.index(name)])


def _truncated(fmt: str, data: bytes) -> str | None:
    """Why ``data`` is visibly cut short for its format, if it is: end markers and declared sizes
    are checked, pixels are not."""
    if fmt == "png":
        if not data.endswith(b"IEND\xaeB`\x82"):
            return "PNG without its IEND chunk at the end: truncated?"
    elif fmt == "jpeg":
        if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            return "JPEG without its end-of-image marker at the end: truncated?"
    elif fmt == "gif":
        if not data.endswith(b";"):
            return "GIF without its trailer at the end: truncated?"
    elif fmt == "bmp":
        declared = int.from_bytes(data[2:6], "little")
        if len(data) < declared:
            return f"BMP of {len(data)} bytes, its header says {declared}: truncated?"
    elif fmt == "webp":
        declared = int.from_bytes(data[4:8], "little") + 8
        if len(data) < declared:
            return f"WebP of {len(data)} bytes, its header says {declared}: truncated?"
    return None


class ImageEncoderConfig(EncoderConfig):
    """An Example per image file (whole-file events, as the directory source's
    ``format = "whole-file"`` makes), with the features TensorFlow's image models read."""

    type: Literal["image"] = "image"
    labels: dict[str, int] = pydantic.Field(default_factory=dict)
    """Parent folder name → class number, written as ``image/class/label``
    (``labels = { cat = 0, dog = 1 }``). Empty (the default): no ``image/class/label`` at all."""
    unknown_label: Literal["dead-letter", "omit"] = "dead-letter"
    """What to do with an image whose folder is not in ``labels``: send it to the dead letters,
    or write it without ``image/class/label`` (readers then see the description's default, -1)."""
    formats: list[str] = pydantic.Field(default=list(DEFAULT_FORMATS), min_length=1)
    """The image formats accepted, by the names of Pillow's readers in lower case (``jpeg``,
    ``png``, ``gif``, ``bmp``, ``webp``, ``tiff``...). A file in any other format is a dead
    letter; only these readers ever see a file."""
    max_pixels: int = pydantic.Field(default=PILLOW_MAX_IMAGE_PIXELS, ge=1)
    """Refuse images of more pixels (width times height) than this, as read from the header.
    Pillow's own bomb check applies too: it refuses outright an image of over twice
    ``PIL.Image.MAX_IMAGE_PIXELS``."""
    check_complete: bool = True
    """Refuse a file whose end marker or declared size shows it was cut short (PNG ``IEND``,
    JPEG end-of-image, GIF trailer, BMP and WebP sizes): found without decoding pixels. Turn
    off for JPEGs that carry data appended after the image."""

    @pydantic.field_validator("labels")
    @classmethod
    def _label_numbers(cls, labels: dict[str, int]) -> dict[str, int]:
        for folder, number in labels.items():
            if not folder:
                raise ValueError("a folder name must not be empty")
            if not INT64_MIN <= number <= INT64_MAX:
                raise ValueError(f"label of {folder!r} is outside int64: {number}")
        return labels

    @pydantic.field_validator("formats")
    @classmethod
    def _known_formats(cls, formats: list[str]) -> list[str]:
        known = _pillow_formats()
        unknown = [f for f in formats if f not in known]
        if unknown:
            raise ValueError(
                f"unknown image format(s) {unknown}; Pillow knows: {', '.join(sorted(known))}"
            )
        return formats

    def build(self) -> ImageEncoder:
        return ImageEncoder(self)

    def feature_description(self) -> dict[str, Any]:
        """The ``tf.io.parse_example`` features that read what this encoder writes."""

        def fixed(dtype: str, **extra: Any) -> dict[str, Any]:
            return {"kind": "FixedLenFeature", "shape": [], "dtype": dtype, **extra}

        out = {
            ENCODED: fixed("string"),
            FORMAT: fixed("string"),
            HEIGHT: fixed("int64"),
            WIDTH: fixed("int64"),
            CHANNELS: fixed("int64"),
            FILENAME: fixed("string"),
            TEXT: fixed("string"),
        }
        if self.labels:
            if self.unknown_label == "omit":
                out[LABEL] = fixed("int64", default_value=-1)
            else:
                out[LABEL] = fixed("int64")
        return out


_encoded_head = BytesEntryHead(ENCODED)
"""What precedes a file's bytes in its ``image/encoded`` map entry."""


# The Example's map entries are written in the order of their keys: the entries of the features
# that are the same for many files (channels, folder and label; format and size) are written once
# and kept, the file name's for each file, and the record is one join around the file's bytes,
# which are copied once.
_BEFORE = ((CHANNELS, FeatureType.INT64), (TEXT, FeatureType.BYTES), (LABEL, FeatureType.INT64))
_NAME = ((FILENAME, FeatureType.BYTES),)
_AFTER = ((FORMAT, FeatureType.BYTES), (HEIGHT, FeatureType.INT64), (WIDTH, FeatureType.INT64))
assert max(k.encode() for k, _ in _BEFORE) < ENCODED.encode() < FILENAME.encode()
assert FILENAME.encode() < min(k.encode() for k, _ in _AFTER)
assert sorted(FEATURES) == sorted(((ENCODED, FeatureType.BYTES), *_BEFORE, *_NAME, *_AFTER))
_CACHED = 4096
"""Entries kept per cache; a full cache starts again empty."""


class ImageEncoder(Encoder):
    """Reads each file's header (the fast path, else Pillow) and writes the image features."""

    def __init__(self, config: ImageEncoderConfig) -> None:
        self.config = config
        self._labels = dict(config.labels)
        self._pillow_formats = [f.upper() for f in config.formats]
        self._fast_jpeg = _has_fast_path(self._pillow_formats, "JPEG")
        self._fast_png = _has_fast_path(self._pillow_formats, "PNG")
        self._before = ExampleWriter(_BEFORE)
        self._name = ExampleWriter(_NAME)
        self._after = ExampleWriter(_AFTER)
        self._max_pixels = config.max_pixels
        self._check_complete = config.check_complete
        self._before_cache: dict[tuple[int, str, int | None], bytes] = {}
        self._after_cache: dict[tuple[str, int, int], bytes] = {}

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        append = result.records.append
        encode = self.encode
        for i, ev in enumerate(events):
            try:
                append(encode(ev))
            except _Refused as e:
                result.failures.append(Failure(i, e.category, str(e.error)))
        return result

    def values(self, ev: RawEvent) -> list[list[Any] | None]:
        """The values of :data:`FEATURES` for one whole-file event, in that order; raises
        :class:`_Refused` with a category."""
        data, fmt, width, height, channels, filename, folder, label = self._read(ev)
        label_value = None if label is None else [label]
        return [[data], [fmt], [height], [width], [channels], [filename], [folder], label_value]

    def encode(self, ev: RawEvent) -> bytes:
        """The Example of one whole-file event; raises :class:`_Refused` with a category."""
        data, fmt, width, height, channels, filename, folder, label = self._read(ev)
        key = (channels, folder, label)
        before = self._before_cache.get(key) if folder.__class__ is str else None
        if before is None:
            label_value = None if label is None else [label]
            before = map_entries(self._before.encode([[channels], [folder], label_value]))
            if folder.__class__ is str:
                if len(self._before_cache) >= _CACHED:
                    self._before_cache.clear()
                self._before_cache[key] = before
        size_key = (fmt, height, width)
        after = self._after_cache.get(size_key)
        if after is None:
            after = map_entries(self._after.encode([[fmt], [height], [width]]))
            if len(self._after_cache) >= _CACHED:
                self._after_cache.clear()
            self._after_cache[size_key] = after
        name = map_entries(self._name.encode([[filename]]))
        head = _encoded_head(len(data))
        size = len(before) + len(head) + len(data) + len(name) + len(after)
        return b"".join((example_head(size), before, head, data, name, after))

    def _read(self, ev: RawEvent) -> tuple[bytes, str, int, int, int, str, str, int | None]:
        """The file's bytes, format, width, height and channels, name, folder and label."""
        if ev.format != "file" or not isinstance(ev.value, dict):
            raise _Refused(
                FailureReason.FORMAT, EncodeError(f"expected a whole-file event, got {ev.format!r}")
            )
        data = ev.payload if ev.payload.__class__ is bytes else bytes(ev.payload)
        fmt, width, height, channels = self._header(data)
        folder = ev.value.get("label") or ""
        label = None
        if self._labels:
            label = self._labels.get(folder)
            if label is None and self.config.unknown_label == "dead-letter":
                known = ", ".join(sorted(self._labels))
                raise _Refused(
                    FailureReason.LABEL,
                    EncodeError(f"folder {folder!r} is not in labels (known: {known})", LABEL),
                )
        filename = str(ev.value.get("filename") or "")
        return data, fmt, width, height, channels, filename, folder, label

    def _header(self, data: bytes) -> tuple[str, int, int, int]:
        if self._fast_jpeg and data.startswith(_JPEG_MAGIC):
            fmt, found = "jpeg", jpeg_header(data)
        elif self._fast_png and data.startswith(_PNG_MAGIC):
            fmt, found = "png", png_header(data)
        else:
            found = None
        if found is not None:
            limit = Image.MAX_IMAGE_PIXELS  # Pillow's own bomb check: past it, Pillow decides
            if limit is None or found[0] * found[1] <= limit:
                return self._checked(fmt, *found, data)
        allowed = ", ".join(self.config.formats)
        try:
            with Image.open(io.BytesIO(data), formats=self._pillow_formats) as im:
                # Pillow's JPEG reader calls a JPEG with extra pictures (camera files) MPO.
                fmt = "jpeg" if im.format == "MPO" else (im.format or "").lower()
                width, height = im.size
                channels = channels_of(im)
                if fmt == "bmp":
                    channels = bmp_channels(data, channels)
                elif fmt == "png":
                    channels = png_channels(data, channels)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            # The warning is an exception only where warnings are errors; elsewhere the size
            # check below refuses the image.
            raise _Refused(FailureReason.TOO_LARGE, EncodeError(str(e), ENCODED)) from None
        except UnidentifiedImageError:
            reason = f"not an image in an allowed format ({allowed})"
            raise _Refused(FailureReason.MALFORMED, EncodeError(reason, ENCODED)) from None
        except Exception as e:
            reason = f"not a readable image ({allowed}): {type(e).__name__}: {e}"
            raise _Refused(FailureReason.MALFORMED, EncodeError(reason, ENCODED)) from None
        return self._checked(fmt, width, height, channels, data)

    def _checked(
        self, fmt: str, width: int, height: int, channels: int, data: bytes
    ) -> tuple[str, int, int, int]:
        """The header's findings, once the size cap and the completeness check pass."""
        if width * height > self._max_pixels:
            raise _Refused(
                FailureReason.TOO_LARGE,
                EncodeError(
                    f"{width}x{height} is {width * height} pixels, over max_pixels "
                    f"({self.config.max_pixels})",
                    ENCODED,
                ),
            )
        if self._check_complete and (why := _truncated(fmt, data)) is not None:
            raise _Refused(FailureReason.MALFORMED, EncodeError(why, ENCODED))
        return fmt, width, height, channels


class _Refused(TfrecorddError):
    """An image event refused, with its dead-letter category."""

    def __init__(self, category: FailureReason, error: EncodeError) -> None:
        super().__init__(str(error))
        self.category = category
        self.error = error
