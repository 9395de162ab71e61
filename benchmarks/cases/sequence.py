"""Case 4: JSON sessions of 50 steps to gzip SequenceExample shards.

Baseline: ``json.loads`` + ``tf.train.SequenceExample`` built in Python (one ``Feature`` per step
and per list) + ``TFRecordWriter(gzip)``. Ours: the sequence encoder's ``encode_batch`` +
``RecordWriter(gzip)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfrecordd.format.compression import Compression
from tfrecordd_plugins.encoders.sequence import SequenceEncoderConfig

from ..data import SEQUENCE_CONTEXT, SEQUENCE_LISTS, sequence_lines
from ..harness import Context, Row, best_of_pair, ratio_row
from .common import count_tf_records, encode_and_write, raw_events, tf_options

TARGET = None  # the issue sets no target for this case


def tf_loop(tf: Any, lines: list[bytes], path: Path) -> None:
    train = tf.train
    with tf.io.TFRecordWriter(str(path), options=tf_options(tf, Compression.GZIP)) as w:
        for line in lines:
            e = json.loads(line)
            context = train.Features(
                feature={
                    "session": train.Feature(
                        bytes_list=train.BytesList(value=[e["session"].encode()])
                    ),
                    "user_age": train.Feature(int64_list=train.Int64List(value=[e["user_age"]])),
                    "length": train.Feature(int64_list=train.Int64List(value=[len(e["item"])])),
                }
            )
            lists = train.FeatureLists(
                feature_list={
                    "item": train.FeatureList(
                        feature=[
                            train.Feature(int64_list=train.Int64List(value=[x])) for x in e["item"]
                        ]
                    ),
                    "dwell": train.FeatureList(
                        feature=[
                            train.Feature(float_list=train.FloatList(value=[x])) for x in e["dwell"]
                        ]
                    ),
                    "query": train.FeatureList(
                        feature=[
                            train.Feature(bytes_list=train.BytesList(value=[x.encode()]))
                            for x in e["query"]
                        ]
                    ),
                }
            )
            example = train.SequenceExample(context=context, feature_lists=lists)
            w.write(example.SerializeToString())


def run(ctx: Context) -> list[Row]:
    n = max(ctx.events // 10, 10)
    lines = sequence_lines(n, ctx.steps, ctx.seed)
    events = raw_events(lines)
    encoder = SequenceEncoderConfig.model_validate(
        {"context": SEQUENCE_CONTEXT, "feature_lists": SEQUENCE_LISTS}
    ).build()
    with ctx.tmpdir("sequence") as tmp:
        ours_path, tf_path = tmp / "ours.tfrecord.gz", tmp / "tf.tfrecord.gz"
        tf = ctx.tf
        ours, base = best_of_pair(
            lambda: encode_and_write(encoder, events, ours_path, Compression.GZIP),
            (lambda: tf_loop(tf, lines, tf_path)) if tf is not None else None,
            ctx.repeat,
        )
        if tf is not None and count_tf_records(tf, ours_path, Compression.GZIP) != n:
            raise AssertionError("TensorFlow does not read back every SequenceExample")
    return [
        ratio_row(
            f"4 SequenceExample, {ctx.steps} steps",
            "events/s, one process",
            "events/s",
            n / ours,
            n / base if base else None,
            "json.loads + tf.train.SequenceExample + TFRecordWriter",
            TARGET,
            f"{sum(map(len, lines)) / n:.0f}-byte JSON lines, 3 feature lists, gzip",
        )
    ]
