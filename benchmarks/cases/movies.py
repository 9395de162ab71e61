"""Case 1: JSON movie-recommendation events to gzip Example shards, in one process.

Baseline: what a user writes with TensorFlow alone, ``json.loads`` + ``tf.train.Example(...)`` +
``tf.io.TFRecordWriter(gzip).write`` per event. Ours: the example encoder's ``encode_batch`` on
the same JSON lines, then ``RecordWriter(gzip).write_many``, batch by batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfrecordd.format.compression import Compression
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

from ..data import MOVIE_FEATURES, movie_lines
from ..harness import Context, Row, best_of_pair, ratio_row
from .common import count_tf_records, encode_and_write, raw_events, tf_options

TARGET = 5.0


def tf_loop(tf: Any, lines: list[bytes], path: Path) -> None:
    """The user's alternative, written the way TensorFlow's tutorials write it."""
    train = tf.train
    with tf.io.TFRecordWriter(str(path), options=tf_options(tf, Compression.GZIP)) as w:
        for line in lines:
            e = json.loads(line)
            example = train.Example(
                features=train.Features(
                    feature={
                        "user": train.Feature(
                            bytes_list=train.BytesList(value=[e["user"].encode()])
                        ),
                        "age": train.Feature(int64_list=train.Int64List(value=[e["age"]])),
                        "movie": train.Feature(
                            bytes_list=train.BytesList(value=[m.encode() for m in e["movie"]])
                        ),
                        "movie_ratings": train.Feature(
                            float_list=train.FloatList(value=e["movie_ratings"])
                        ),
                        "suggestion": train.Feature(
                            bytes_list=train.BytesList(value=[e["suggestion"].encode()])
                        ),
                        "suggestion_purchased": train.Feature(
                            float_list=train.FloatList(value=[e["suggestion_purchased"]])
                        ),
                        "purchase_price": train.Feature(
                            float_list=train.FloatList(value=[e["purchase_price"]])
                        ),
                    }
                )
            )
            w.write(example.SerializeToString())


def run(ctx: Context) -> list[Row]:
    lines = movie_lines(ctx.events, ctx.seed)
    events = raw_events(lines)
    encoder = ExampleEncoderConfig.model_validate({"features": MOVIE_FEATURES}).build()
    n = len(lines)
    with ctx.tmpdir("movies") as tmp:
        ours_path = tmp / "ours.tfrecord.gz"
        tf_path = tmp / "tf.tfrecord.gz"
        tf = ctx.tf
        ours, base = best_of_pair(
            lambda: encode_and_write(encoder, events, ours_path, Compression.GZIP),
            (lambda: tf_loop(tf, lines, tf_path)) if tf is not None else None,
            ctx.repeat,
        )
        note = f"{sum(map(len, lines)) / n:.0f}-byte JSON lines; gzip level 6 on both sides"
        if tf is not None:
            got = count_tf_records(tf, ours_path, Compression.GZIP)
            if got != n:
                raise AssertionError(f"TensorFlow reads {got} records of {n} from our shard")
            note += (
                f"; shard {ours_path.stat().st_size:,} bytes"
                f" (TensorFlow's {tf_path.stat().st_size:,})"
            )
    return [
        ratio_row(
            "1 JSON -> Example (gzip)",
            "events/s, one process",
            "events/s",
            n / ours,
            n / base if base else None,
            "json.loads + tf.train.Example + TFRecordWriter",
            TARGET,
            note,
        )
    ]
