"""What an image file's header says: format, size and the channels TensorFlow decodes it to.

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
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence

from PIL import Image, PngImagePlugin

__all__ = [
    "JPEG_MAGIC",
    "PNG_MAGIC",
    "bmp_channels",
    "channels_of",
    "has_fast_path",
    "jpeg_header",
    "pillow_formats",
    "png_channels",
    "png_header",
    "truncated",
]

_ONE_CHANNEL = frozenset({"1", "L", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
_TWO_CHANNELS = frozenset({"LA", "La"})
_THREE_CHANNELS = frozenset({"RGB", "YCbCr", "LAB", "HSV"})
_FOUR_CHANNELS = frozenset({"RGBA", "RGBa", "RGBX", "CMYK", "PA"})


def pillow_formats() -> frozenset[str]:
    """The formats this Pillow opens, by the names of its readers in lower case."""
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

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
"""The first bytes of a PNG."""
JPEG_MAGIC = b"\xff\xd8\xff"
"""The first bytes of a JPEG."""
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
    if n < 41 or not data.startswith(PNG_MAGIC) or _CHUNK_HEAD(data, 8) != (13, b"IHDR"):
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
    if not data.startswith(JPEG_MAGIC):
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


def has_fast_path(pillow_formats: Sequence[str], name: str) -> bool:
    """Whether ``Image.open(..., formats=pillow_formats)`` hands a file with the magic of
    ``name`` (JPEG or PNG) to that format's reader first: no reader before it could take it."""
    if name not in pillow_formats or (name == "PNG" and not _PNG_MODES):
        return False
    return all(f in _DISJOINT_MAGIC for f in pillow_formats[: pillow_formats.index(name)])


def truncated(fmt: str, data: bytes) -> str | None:
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
