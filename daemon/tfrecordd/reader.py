"""The public reading API: a dataset's shards listed, read, fed to TensorFlow or PyTorch.

Records of one shard (local path, fsspec URL or stream; CRCs verified, compression detected)::

    from tfrecordd.reader import iter_records, iter_examples
    for example in iter_examples("shards/part-….tfrecord.gz"):  # {"feature": [values...]}
        ...

A dataset (an output directory, local or ``s3://…``): :func:`list_shards` gives its published
shards, never an in-progress or sidecar file, optionally only some partitions, a time range, or
completed partitions; :func:`check_partition` says what is wrong with a completed one.

- TensorFlow: :func:`tf_dataset` builds ``TFRecordDataset`` + ``tf.io.parse_example`` from the
  schema's feature description (:func:`tf_features`); TensorFlow is imported there only.
- PyTorch: :class:`TorchShardDataset` / :func:`torch_dataset` split the shards across
  DataLoader workers and ranks, and resume mid-epoch from a :class:`ShardPosition` per worker
  (:class:`PositionTracker`), skipping records unread with the manifests' offsets
  (:func:`iter_records_from`); torch is imported by :func:`torch_dataset` only.

Everything :mod:`tfrecordd.format.reader` offers is here too, under the same names; imports from
there keep working. ``docs/reading.md`` is the guide.
"""

from __future__ import annotations

from tfrecordd.format.compression import Compression
from tfrecordd.format.proto import FeatureValues, parse_example, parse_sequence_example
from tfrecordd.format.reader import (
    Source,
    iter_examples,
    iter_records,
    iter_records_with_offsets,
    iter_sequence_examples,
)
from tfrecordd.readers.check import check_partition
from tfrecordd.readers.layout import (
    LATE_DIR,
    MARKER_NAME,
    MarkedShard,
    Marker,
    Shard,
    TimeBound,
    list_shards,
    partition_values,
    shard_compression,
)
from tfrecordd.readers.seek import iter_records_from, record_offsets
from tfrecordd.readers.tfdata import (
    is_sequence_description,
    shard_files,
    tf_dataset,
    tf_features,
)
from tfrecordd.readers.torchdata import (
    PositionTracker,
    ShardPosition,
    TorchShardDataset,
    split_shards,
    torch_dataset,
)

__all__ = [
    "LATE_DIR",
    "MARKER_NAME",
    "Compression",
    "FeatureValues",
    "MarkedShard",
    "Marker",
    "PositionTracker",
    "Shard",
    "ShardPosition",
    "Source",
    "TimeBound",
    "TorchShardDataset",
    "check_partition",
    "is_sequence_description",
    "iter_examples",
    "iter_records",
    "iter_records_from",
    "iter_records_with_offsets",
    "iter_sequence_examples",
    "list_shards",
    "parse_example",
    "parse_sequence_example",
    "partition_values",
    "record_offsets",
    "shard_compression",
    "shard_files",
    "split_shards",
    "tf_dataset",
    "tf_features",
    "torch_dataset",
]
