"""tfrecordd: events in, rotating compressed TFRecord shards out, exactly once."""

from __future__ import annotations

from tfrecordd.errors import (
    CompressionError,
    ConfigError,
    CorruptRecordError,
    DecodeError,
    EncodeError,
    RecordError,
    RecordLimitError,
    TfrecorddError,
    TruncatedRecordError,
)

__version__ = "0.1.0"

__all__ = [
    "CompressionError",
    "ConfigError",
    "CorruptRecordError",
    "DecodeError",
    "EncodeError",
    "RecordError",
    "RecordLimitError",
    "TfrecorddError",
    "TruncatedRecordError",
    "__version__",
]
