"""What the in-process cases share: tfrecordd's hot path and TensorFlow's writer, into files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import RecordWriter
from tfrecordd.plugin import Encoder, RawEvent

BATCH = 1000
"""Events per batch: the daemon's default ``max_batch_events``."""


def raw_events(payloads: Sequence[bytes]) -> list[RawEvent]:
    """Events as the directory source makes them (made before timing: reading is not measured)."""
    return [RawEvent(p, f"bench.jsonl:{i}") for i, p in enumerate(payloads)]


def encode_and_write(
    encoder: Encoder,
    events: Sequence[RawEvent],
    path: Path,
    compression: Compression,
    batch: int = BATCH,
) -> int:
    """What the daemon's hot path does per batch: ``encode_batch``, then ``write_many``."""
    with path.open("wb") as f:
        writer = RecordWriter(f.write, compression)
        for start in range(0, len(events), batch):
            result = encoder.encode_batch(events[start : start + batch])
            if result.failures:
                raise AssertionError(f"encoder refused events: {result.failures[:3]}")
            writer.write_many(result.records)
        writer.finish()
    return writer.records


def tf_options(tf: Any, compression: Compression) -> Any:
    kind = {Compression.NONE: "", Compression.GZIP: "GZIP", Compression.ZLIB: "ZLIB"}[compression]
    return tf.io.TFRecordOptions(compression_type=kind)


def count_tf_records(tf: Any, path: Path, compression: Compression) -> int:
    """Records in a file as TensorFlow's own reader sees them (a check, not timed)."""
    kind = {Compression.NONE: "", Compression.GZIP: "GZIP", Compression.ZLIB: "ZLIB"}[compression]
    return sum(1 for _ in tf.data.TFRecordDataset(str(path), compression_type=kind))
