"""A dataset's shards as a ``tf.data`` pipeline: ``TFRecordDataset``, then ``tf.io`` parsing.

TensorFlow is optional: it is imported inside these functions only, so reading shards with
tfrecordd's own reader or with PyTorch never loads it. The features are either ``tf.io`` feature
objects or the plain data ``tfrecordd schema --format json`` prints
(:func:`tfrecordd.cli.describe.feature_description`).
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tfrecordd.errors import TfrecorddError
from tfrecordd.format.compression import TF_COMPRESSION_TYPE, Compression, compression_from_name
from tfrecordd.fsys import is_url, local_path
from tfrecordd.readers.layout import Shard, list_shards, shard_compression

_SEQUENCE_KEYS = {"context_features", "sequence_features"}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _tensorflow() -> Any:
    try:
        return importlib.import_module("tensorflow")
    except ImportError as e:
        raise TfrecorddError(
            f"TensorFlow is not installed ({e}): pip install tensorflow-cpu (or tensorflow)"
        ) from None


def is_sequence_description(description: Mapping[str, Any]) -> bool:
    """Whether ``description`` is a SequenceExample's: ``{"context_features": {...},
    "sequence_features": {...}}`` (the arguments of ``tf.io.parse_sequence_example``)."""
    return set(description) == _SEQUENCE_KEYS and all(
        isinstance(v, Mapping) and "kind" not in v for v in description.values()
    )


def _is_description(features: Mapping[str, Any]) -> bool:
    values = list(features.values())
    if is_sequence_description(features):
        values = [v for part in features.values() for v in part.values()]
    return bool(values) and all(isinstance(v, Mapping) and "kind" in v for v in values)


def _default(value: Any, dtype: str) -> Any:
    """A JSON default value as ``tf.io`` wants it: the strings JSON writes for NaN and the
    infinities are floats again."""
    if isinstance(value, list):
        return [_default(v, dtype) for v in value]
    if dtype.startswith("float") and isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    return value


def _spec(tf: Any, name: str, description: Mapping[str, Any]) -> Any:
    kind = description.get("kind")
    try:
        dtype = tf.dtypes.as_dtype(description["dtype"])
    except (KeyError, TypeError) as e:
        raise TfrecorddError(f"feature {name!r}: no valid dtype ({e})") from None
    if kind == "VarLenFeature":
        return tf.io.VarLenFeature(dtype)
    shape = list(description.get("shape", []))
    if kind == "FixedLenFeature":
        default = description.get("default_value")
        if default is not None:
            default = _default(default, str(description["dtype"]))
        return tf.io.FixedLenFeature(shape, dtype, default)
    if kind == "FixedLenSequenceFeature":
        allow_missing = bool(description.get("allow_missing", False))
        return tf.io.FixedLenSequenceFeature(shape, dtype, allow_missing=allow_missing)
    raise TfrecorddError(f"feature {name!r}: unknown kind {kind!r}")


def tf_features(description: Mapping[str, Any]) -> dict[str, Any]:
    """``tf.io`` feature objects from the plain-data description ``tfrecordd schema --format
    json`` prints: ``{name: {"kind", "dtype"[, "shape"][, "default_value"][, "allow_missing"]}}``
    for ``tf.io.parse_example``, or, for a SequenceExample, ``{"context_features": {...},
    "sequence_features": {...}}`` with the same shape kept. Imports TensorFlow."""
    tf = _tensorflow()
    if is_sequence_description(description):
        return {
            part: {n: _spec(tf, n, d) for n, d in description[part].items()}
            for part in ("context_features", "sequence_features")
        }
    return {name: _spec(tf, name, d) for name, d in description.items()}


def _paths(
    shards: str | os.PathLike[str] | Iterable[Shard | str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None,
) -> list[tuple[str, Compression | None]]:
    if isinstance(shards, str | os.PathLike):
        shards = list_shards(shards, storage_options=storage_options)
    found: list[tuple[str, Compression | None]] = []
    for shard in shards:
        if isinstance(shard, Shard):
            found.append((shard.path, shard.compression))
            continue
        path = os.fspath(shard)
        name = path.rpartition("/")[2]
        named = shard_compression(name)
        found.append((path, named or compression_from_name(name)))
    return found


def shard_files(
    shards: str | os.PathLike[str] | Iterable[Shard | str | os.PathLike[str]],
    compression: Compression | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[list[str], Compression]:
    """The file names and the one compression to hand ``tf.data.TFRecordDataset``.

    ``shards``: a dataset's location (every published shard, :func:`list_shards`), or shards
    and paths. The compression comes from the names' suffixes unless ``compression`` is given;
    shards of different compressions, and zstd shards, are refused with a
    :class:`~tfrecordd.errors.TfrecorddError` that says what to do. Needs no TensorFlow."""
    paths = _paths(shards, storage_options)
    if compression is not None:
        kinds = {Compression(compression)}
    else:
        kinds = {c or Compression.NONE for _, c in paths}
    if len(kinds) > 1:
        names = ", ".join(sorted(kinds))
        raise TfrecorddError(
            f"the shards mix compressions ({names}): TFRecordDataset reads one; make a dataset "
            "per compression and concatenate them, or transcode (tfrecordd transcode --to gzip)"
        )
    kind = kinds.pop() if kinds else Compression.NONE
    if TF_COMPRESSION_TYPE[kind] is None:
        raise TfrecorddError(
            f"TensorFlow cannot read {kind} shards: transcode them to gzip first "
            "(tfrecordd transcode SHARD... --to gzip --out DIR), or read them with "
            "tfrecordd.reader.iter_records"
        )
    return [p if is_url(p) else local_path(p) for p, _ in paths], kind


def tf_dataset(
    shards: str | os.PathLike[str] | Iterable[Shard | str | os.PathLike[str]],
    features: Mapping[str, Any] | None = None,
    *,
    batch_size: int | None = 256,
    drop_remainder: bool = False,
    compression: Compression | str | None = None,
    num_parallel_reads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """A ``tf.data.Dataset`` reading ``shards`` and parsing their records with ``features``.

    ``shards``: a dataset's location (every published shard, in :func:`list_shards`' order; call
    :func:`list_shards` yourself to choose partitions, a time range or completed partitions), or
    shards and paths (in the order given). They are read with ``tf.data.TFRecordDataset``
    (``num_parallel_reads`` files at once; the compression as :func:`shard_files` finds it).

    ``features``: a dict of ``tf.io`` feature objects, or the plain-data description of
    ``tfrecordd schema --format json`` (converted by :func:`tf_features`); a SequenceExample's
    description, or ``{"context_features": {...}, "sequence_features": {...}}`` of feature
    objects, parses SequenceExamples. ``None``: the serialized records, not parsed.

    Records are batched by ``batch_size`` (``drop_remainder`` drops a short last batch) and each
    batch parsed with ``tf.io.parse_example`` (or ``parse_sequence_example``, whose result is
    TensorFlow's ``(context, feature_lists, lengths)``); ``batch_size=None`` parses record by
    record (``parse_single_example``, ``parse_single_sequence_example``: ``(context,
    feature_lists)``). Imports TensorFlow.
    """
    files, kind = shard_files(shards, compression, storage_options)
    tf = _tensorflow()
    names = tf.constant(files, dtype=tf.string)
    ds = tf.data.TFRecordDataset(
        names, compression_type=TF_COMPRESSION_TYPE[kind], num_parallel_reads=num_parallel_reads
    )
    if batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if features is None:
        return ds
    specs = tf_features(features) if _is_description(features) else dict(features)
    if is_sequence_description(specs):
        context, sequence = specs["context_features"], specs["sequence_features"]
        if batch_size is None:
            return ds.map(
                lambda r: tf.io.parse_single_sequence_example(r, context, sequence),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
        return ds.map(
            lambda b: tf.io.parse_sequence_example(b, context, sequence),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    parse = tf.io.parse_example if batch_size is not None else tf.io.parse_single_example
    return ds.map(lambda b: parse(b, specs), num_parallel_calls=tf.data.AUTOTUNE)
