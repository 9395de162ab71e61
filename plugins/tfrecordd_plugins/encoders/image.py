"""``type = "image"``: whole image files to ``tf.train.Example``, the way TensorFlow's image models
read them.

The features follow the names of TensorFlow's image pipelines (Inception's ``build_image_data``,
the object detection API, TF-Slim): ``image/encoded`` holds the file's bytes as they are (never
re-encoded), ``image/format`` the format in lower case (``b"jpeg"``, ``b"png"``...),
``image/height``, ``image/width`` and ``image/channels`` the size read from the file's header
(the channels as ``tf.io.decode_image`` decodes the file, so a reshape by them holds),
``image/filename`` the file's name, ``image/class/text`` the name of its parent folder and
``image/class/label`` that name's number in the configured ``labels``.

The header is read, and no pixel decoded, by :mod:`tfrecordd_plugins.encoders.image_headers`
(a fast path for PNG and JPEG, Pillow for the rest and for every refusal).

The record is written with one copy of the file's bytes (:meth:`ImageEncoder.encode` joins the
small features' entries around them), byte for byte what
:class:`~tfrecordd.format.wire.ExampleWriter` writes for the same features.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

import pydantic
from PIL import Image, UnidentifiedImageError

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
from tfrecordd_plugins.encoders.image_headers import (
    JPEG_MAGIC,
    PNG_MAGIC,
    bmp_channels,
    channels_of,
    has_fast_path,
    jpeg_header,
    pillow_formats,
    png_channels,
    png_header,
    truncated,
)

__all__ = ["ImageEncoder", "ImageEncoderConfig"]

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
        known = pillow_formats()
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
CACHED = 4096
"""Entries kept per cache; a full cache starts again empty."""


class ImageEncoder(Encoder):
    """Reads each file's header (the fast path, else Pillow) and writes the image features."""

    def __init__(self, config: ImageEncoderConfig) -> None:
        self.config = config
        self._labels = dict(config.labels)
        self._pillow_formats = [f.upper() for f in config.formats]
        self.fast_jpeg = has_fast_path(self._pillow_formats, "JPEG")
        """Whether JPEG headers are read by the fast path (else by Pillow)."""
        self.fast_png = has_fast_path(self._pillow_formats, "PNG")
        """Whether PNG headers are read by the fast path (else by Pillow)."""
        self._before = ExampleWriter(_BEFORE)
        self._name = ExampleWriter(_NAME)
        self._after = ExampleWriter(_AFTER)
        self._max_pixels = config.max_pixels
        self._check_complete = config.check_complete
        self.before_cache: dict[tuple[int, str, int | None], bytes] = {}
        """The encoded features before the image bytes, by (channels, folder, label)."""
        self.after_cache: dict[tuple[str, int, int], bytes] = {}
        """The encoded features after the file name, by (format, height, width)."""

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
        before = self.before_cache.get(key) if folder.__class__ is str else None
        if before is None:
            label_value = None if label is None else [label]
            before = map_entries(self._before.encode([[channels], [folder], label_value]))
            if folder.__class__ is str:
                if len(self.before_cache) >= CACHED:
                    self.before_cache.clear()
                self.before_cache[key] = before
        size_key = (fmt, height, width)
        after = self.after_cache.get(size_key)
        if after is None:
            after = map_entries(self._after.encode([[fmt], [height], [width]]))
            if len(self.after_cache) >= CACHED:
                self.after_cache.clear()
            self.after_cache[size_key] = after
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
        fmt, width, height, channels = self.header(data)
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

    def header(self, data: bytes) -> tuple[str, int, int, int]:
        """An image file's format, width, height and channels (as TensorFlow decodes them):
        from the fast path where it reads the header, else from Pillow; raises the refusal the
        encoder would report."""
        if self.fast_jpeg and data.startswith(JPEG_MAGIC):
            fmt, found = "jpeg", jpeg_header(data)
        elif self.fast_png and data.startswith(PNG_MAGIC):
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
        if self._check_complete and (why := truncated(fmt, data)) is not None:
            raise _Refused(FailureReason.MALFORMED, EncodeError(why, ENCODED))
        return fmt, width, height, channels


class _Refused(TfrecorddError):
    """An image event refused, with its dead-letter category."""

    def __init__(self, category: FailureReason, error: EncodeError) -> None:
        super().__init__(str(error))
        self.category = category
        self.error = error
