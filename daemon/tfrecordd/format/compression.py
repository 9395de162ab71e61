"""Stream compression for TFRecord shards: none, gzip, zlib (the three TensorFlow reads) and zstd.

A shard is written as a sequence of *compression units*, each ended by a sync point: a gzip
member, a zstd frame, or a raw deflate segment ended by a full flush inside one zlib stream.
This module names the kinds and what goes with each (suffixes, levels, TensorFlow's names);
:mod:`tfrecordd.format.compress` writes them (:class:`~tfrecordd.format.compress.Compressor`) and
:mod:`tfrecordd.format.decompress` reads them
(:func:`~tfrecordd.format.decompress.open_decompressed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "GZIP_MAGIC",
    "SUFFIXES",
    "TF_COMPRESSION_TYPE",
    "ZSTD_MAGIC",
    "Compression",
    "compression_from_name",
]


class Compression(StrEnum):
    """How a TFRecord stream is compressed."""

    NONE = "none"
    GZIP = "gzip"
    ZLIB = "zlib"
    ZSTD = "zstd"


SUFFIXES: Final[Mapping[Compression, str]] = {
    Compression.NONE: ".tfrecord",
    Compression.GZIP: ".tfrecord.gz",
    Compression.ZLIB: ".tfrecord.zz",
    Compression.ZSTD: ".tfrecord.zst",
}
"""File name suffix of a shard in each compression."""

TF_COMPRESSION_TYPE: Final[Mapping[Compression, str | None]] = {
    Compression.NONE: "",
    Compression.GZIP: "GZIP",
    Compression.ZLIB: "ZLIB",
    Compression.ZSTD: None,
}
"""``compression_type`` for ``tf.data.TFRecordDataset``; ``None``: TensorFlow cannot read it."""

DEFAULT_LEVELS: Final[Mapping[Compression, int]] = {
    Compression.NONE: 0,
    Compression.GZIP: 6,
    Compression.ZLIB: 6,
    Compression.ZSTD: 3,
}
"""Level used when none is given."""

DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024**3
"""Default cap on the bytes one compressed file may decompress to."""

_NAME_SUFFIXES: Final[tuple[tuple[str, Compression], ...]] = (
    (".gz", Compression.GZIP),
    (".gzip", Compression.GZIP),
    (".zz", Compression.ZLIB),
    (".zlib", Compression.ZLIB),
    (".zst", Compression.ZSTD),
    (".zstd", Compression.ZSTD),
)
GZIP_MAGIC = b"\x1f\x8b"
"""The first bytes of a gzip member."""
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
"""The first bytes of a zstd frame."""


def compression_from_name(name: str) -> Compression | None:
    """The compression a file name's suffix implies, or ``None`` if it implies none."""
    lower = name.lower()
    for suffix, compression in _NAME_SUFFIXES:
        if lower.endswith(suffix):
            return compression
    return None
