"""``type = "image"``: whole image files to ``tf.train.Example``, the way TensorFlow's image models
read them.

The features follow the names of TensorFlow's image pipelines (Inception's ``build_image_data``,
the object detection API, TF-Slim): ``image/encoded`` holds the file's bytes as they are (never
re-encoded), ``image/format`` the format in lower case (``b"jpeg"``, ``b"png"``...),
``image/height``, ``image/width`` and ``image/channels`` the size read from the file's header,
``image/filename`` the file's name, ``image/class/text`` the name of its parent folder and
``image/class/label`` that name's number in the configured ``labels``.

Only the header is read (Pillow's ``Image.open``): no pixel is decoded, so a file costs little
whatever its size, and a decompression bomb costs nothing but a refusal.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

import pydantic
from PIL import Image, UnidentifiedImageError

from tfrecordd.errors import EncodeError, TfrecorddError
from tfrecordd.plugin import Encoder, EncoderConfig, EncodeResult, RawEvent
from tfrecordd.wire import INT64_MAX, INT64_MIN, ExampleWriter, FeatureType

__all__ = ["ImageEncoder", "ImageEncoderConfig", "channels_of"]

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

_ONE_CHANNEL = frozenset({"1", "L", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
_TWO_CHANNELS = frozenset({"LA", "La"})
_THREE_CHANNELS = frozenset({"RGB", "YCbCr", "LAB", "HSV"})
_FOUR_CHANNELS = frozenset({"RGBA", "RGBa", "RGBX", "CMYK", "PA"})


def _pillow_formats() -> frozenset[str]:
    Image.init()
    return frozenset(f.lower() for f in Image.OPEN)


def channels_of(image: Image.Image) -> int:
    """The channels a decoder gives by default (``tf.io.decode_image(channels=0)``, Pillow's
    ``convert`` of a palette): a palette counts as the RGB, or RGBA if it has transparency, it
    expands to; a GIF always decodes to RGB."""
    mode = image.mode
    if image.format == "GIF":
        return 3
    if mode == "P":
        return 4 if "transparency" in image.info else 3
    if mode in _ONE_CHANNEL:
        return 1
    if mode in _TWO_CHANNELS:
        return 2
    if mode in _THREE_CHANNELS:
        return 3
    if mode in _FOUR_CHANNELS:
        return 4
    return len(image.getbands())


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


class ImageEncoder(Encoder):
    """Reads each file's header with Pillow and writes the image features."""

    def __init__(self, config: ImageEncoderConfig) -> None:
        self.config = config
        self._labels = dict(config.labels)
        self._pillow_formats = [f.upper() for f in config.formats]
        features = [
            (ENCODED, FeatureType.BYTES),
            (FORMAT, FeatureType.BYTES),
            (HEIGHT, FeatureType.INT64),
            (WIDTH, FeatureType.INT64),
            (CHANNELS, FeatureType.INT64),
            (FILENAME, FeatureType.BYTES),
            (TEXT, FeatureType.BYTES),
            (LABEL, FeatureType.INT64),
        ]
        self._writer = ExampleWriter(features)

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        for i, ev in enumerate(events):
            try:
                result.records.append(self.encode(ev))
            except _Refused as e:
                result.failures.append((i, e.category, str(e.error)))
        return result

    def encode(self, ev: RawEvent) -> bytes:
        """The Example of one whole-file event; raises :class:`_Refused` with a category."""
        if ev.format != "file" or not isinstance(ev.value, dict):
            raise _Refused("format", EncodeError(f"expected a whole-file event, got {ev.format!r}"))
        data = ev.payload if ev.payload.__class__ is bytes else bytes(ev.payload)
        fmt, width, height, channels = self._header(data)
        folder = ev.value.get("label") or ""
        label = None
        if self._labels:
            label = self._labels.get(folder)
            if label is None and self.config.unknown_label == "dead-letter":
                known = ", ".join(sorted(self._labels))
                raise _Refused(
                    "label",
                    EncodeError(f"folder {folder!r} is not in labels (known: {known})", LABEL),
                )
        filename = str(ev.value.get("filename") or "")
        return self._writer.encode(
            [
                [data],
                [fmt],
                [height],
                [width],
                [channels],
                [filename],
                [folder],
                None if label is None else [label],
            ]
        )

    def _header(self, data: bytes) -> tuple[str, int, int, int]:
        allowed = ", ".join(self.config.formats)
        try:
            with Image.open(io.BytesIO(data), formats=self._pillow_formats) as im:
                # Pillow's JPEG reader calls a JPEG with extra pictures (camera files) MPO.
                fmt = "jpeg" if im.format == "MPO" else (im.format or "").lower()
                width, height = im.size
                channels = channels_of(im)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            # The warning is an exception only where warnings are errors; elsewhere the size
            # check below refuses the image.
            raise _Refused("too-large", EncodeError(str(e), ENCODED)) from None
        except UnidentifiedImageError:
            reason = f"not an image in an allowed format ({allowed})"
            raise _Refused("malformed", EncodeError(reason, ENCODED)) from None
        except Exception as e:
            reason = f"not a readable image ({allowed}): {type(e).__name__}: {e}"
            raise _Refused("malformed", EncodeError(reason, ENCODED)) from None
        if width * height > self.config.max_pixels:
            raise _Refused(
                "too-large",
                EncodeError(
                    f"{width}x{height} is {width * height} pixels, over max_pixels "
                    f"({self.config.max_pixels})",
                    ENCODED,
                ),
            )
        if self.config.check_complete and (why := _truncated(fmt, data)) is not None:
            raise _Refused("malformed", EncodeError(why, ENCODED))
        return fmt, width, height, channels


class _Refused(TfrecorddError):
    """An image event refused, with its dead-letter category."""

    def __init__(self, category: str, error: EncodeError) -> None:
        super().__init__(str(error))
        self.category = category
        self.error = error
