"""Case 2: pre-serialized Examples written as they are.

Baseline: TensorFlow's C++ writer (``tf.io.TFRecordWriter.write``) fed the same bytes, which
checks nothing. Ours: the passthrough encoder (each payload parsed and, by default, checked for
unknown fields) and ``RecordWriter``, batch by batch.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from tfrecordd.format.compression import Compression
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.encoders.passthrough import PassthroughEncoderConfig

from ..data import MOVIE_FEATURES, movie_lines
from ..harness import Context, Row, best_of_pair, ratio_row
from .common import encode_and_write, raw_events, tf_options

TARGET = 1.0


def tf_write(tf: Any, records: list[bytes], path: Path, compression: Compression) -> None:
    with tf.io.TFRecordWriter(str(path), options=tf_options(tf, compression)) as w:
        for r in records:
            w.write(r)


def run(ctx: Context) -> list[Row]:
    example = ExampleEncoderConfig.model_validate({"features": MOVIE_FEATURES}).build()
    records = example.encode_batch(raw_events(movie_lines(ctx.events, ctx.seed))).records
    events = raw_events(records)
    n = len(records)
    size = sum(map(len, records)) / n
    rows = []
    with ctx.tmpdir("passthrough") as tmp:
        for compression, unknown in (
            (Compression.NONE, "reject"),
            (Compression.NONE, "keep"),
            (Compression.GZIP, "reject"),
        ):
            encoder = PassthroughEncoderConfig.model_validate({"unknown_fields": unknown}).build()
            ours_path, tf_path = tmp / "ours.tfrecord", tmp / "tf.tfrecord"
            ours, base = best_of_pair(
                partial(encode_and_write, encoder, events, ours_path, compression),
                partial(tf_write, ctx.tf, records, tf_path, compression)
                if ctx.tf is not None
                else None,
                ctx.repeat,
            )
            rows.append(
                ratio_row(
                    "2 passthrough",
                    f"records/s, {compression.value}, unknown_fields={unknown}",
                    "records/s",
                    n / ours,
                    n / base if base else None,
                    "TFRecordWriter.write of the same bytes",
                    TARGET,
                    f"{size:.0f}-byte records; ours checks each one (a walk of the wire format in"
                    " C, protobuf for any it cannot vouch for), TensorFlow checks nothing"
                    if unknown == "reject" and compression is Compression.NONE
                    else "",
                )
            )
    return rows
