"""``tfrecordd convert``: files of JSON lines, CSV or images turned into a dataset's TFRecord
shards in one run, with no daemon: the dataset's encoder and schema, the daemon's shard files,
compression, manifests and atomic publishing, on every core; deterministic, and resumable after
a kill (see :mod:`.run` and :mod:`.runstate`).

Modules: :mod:`.inputs` (what is read, cut into units), :mod:`.encodeunits` (a unit framed and
encoded, in the encode processes), :mod:`.run` (shards written, published, the state saved),
:mod:`.runstate` (the state file, its lock, the dead letters), :mod:`.meter` (progress).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tfrecordd.convert.encodeunits import EncodeSetup
from tfrecordd.convert.inputs import BATCH_BYTES, Format, ReadSettings, list_inputs, plan_units
from tfrecordd.convert.run import NODE_ID, Plan, Run, Summary, args_of, unit_bytes_for
from tfrecordd.convert.runstate import FOLDER
from tfrecordd.errors import EXIT_DATA, EXIT_USAGE, InputError, OutputError, TfrecorddError
from tfrecordd.format.compression import DEFAULT_LEVELS, Compression
from tfrecordd.fsys import is_url, local_path

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

__all__ = ["EXIT_DEAD_LETTERS", "Plan", "Run", "Summary", "plan_conversion"]

EXIT_DEAD_LETTERS = EXIT_DATA
"""The exit status of a conversion that dead-lettered records (without ``--allow-dead-letters``):
65, sysexits' EX_DATAERR, the input data was not all as the schema wants it."""


class ConvertUsageError(TfrecorddError):
    """The arguments ask for what convert cannot do."""

    exit_code = EXIT_USAGE


def read_settings(config: DaemonConfig, dataset: str, fmt: Format | None) -> ReadSettings:
    """How inputs are read: the settings of a directory source feeding ``dataset`` if there is
    one (its ``format`` for files whose name says none), else the source's defaults; ``fmt``
    (``--format``) for every file if given."""
    for source in config.sources:
        if source.type == "directory" and dataset in config.fed_datasets(source):
            return ReadSettings(
                format=fmt,
                default_format=getattr(source, "format", "jsonl"),
                max_line_bytes=int(getattr(source, "max_line_bytes", 1 << 20)),
                max_file_bytes=int(getattr(source, "max_file_bytes", 64 << 20)),
                csv_delimiter=str(getattr(source, "csv_delimiter", ",")),
                csv_encoding=str(getattr(source, "csv_encoding", "utf-8")),
            )
    return ReadSettings(format=fmt)


def plan_conversion(
    config: DaemonConfig,
    dataset: str,
    inputs: Sequence[str],
    *,
    out: str | None = None,
    shard_bytes: int | None = None,
    shards: int | None = None,
    compression: Compression | None = None,
    level: int | None = None,
    fmt: Format | None = None,
    workers: int = 1,
) -> Plan:
    """What converting ``inputs`` into ``dataset`` of ``config`` writes (blocking: lists the
    inputs and reads a few bytes at each cut of a large JSON-lines file).

    Raises:
        ConvertUsageError: a partitioned dataset.
        InputError: an input is missing, or there are no input files.
        OutputError: the output directory (or, for a URL, the local state folder) cannot be
            made.
    """
    d = config.datasets[dataset]
    if d.partition.partitioned:
        raise ConvertUsageError(
            f"dataset {dataset!r} is partitioned ([{config.dataset_key(dataset)}.partition]): "
            "convert writes unpartitioned shards; convert into a dataset without partitions"
        )
    location = out if out is not None else d.dir
    store_config = None
    if is_url(location):
        # An object store: shards staged and the state kept on this machine, under the
        # dataset's staging root (as the daemon stages its uploads), one folder per URL.
        location = location.rstrip("/")
        store_config = config.model_copy(
            update={
                "daemon": config.daemon.model_copy(update={"node_id": NODE_ID}),
                "datasets": config.datasets | {dataset: d.model_copy(update={"dir": location})},
            }
        )
        url_key = hashlib.sha256(location.encode()).hexdigest()[:16]
        state_folder = os.path.join(config.staging_root(dataset), "convert-state", url_key)
        directory = location
        try:
            os.makedirs(state_folder, exist_ok=True)
        except OSError as e:
            raise OutputError(state_folder, f"cannot be made: {e.strerror or e}") from None
    else:
        directory = os.path.abspath(local_path(location))
        state_folder = os.path.join(directory, FOLDER)
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:
            raise OutputError(directory, "exists and is not a directory") from None
        except OSError as e:
            raise OutputError(directory, f"cannot be made: {e.strerror or e}") from None
    if compression is None:
        compression, level = d.compression, d.level if level is None else level
    if compression is Compression.NONE and level is not None:
        raise ConvertUsageError(f"--level {level} with compression none: nothing to compress")
    read = read_settings(config, dataset, fmt)
    files = list_inputs(inputs, read, exclude=None if store_config else directory)
    if not files:
        raise InputError(" ".join(inputs), "holds no input file")
    total = sum(f.size for f in files)
    units = plan_units(files, unit_bytes_for(total, shards))
    encoder = config.encoders[d.encoder]
    shard_bytes = int(d.max_shard_bytes) if shard_bytes is None else shard_bytes
    shard_records = int(d.max_shard_records) if shards is None else 0
    # A batch goes whole into one shard: well under the cap, so shards end near it.
    batch_bytes = (
        BATCH_BYTES if shards is not None else min(BATCH_BYTES, max(shard_bytes // 8, 1024))
    )
    plan_args = {
        "dataset": dataset,
        "encoder": encoder.schema_fingerprint(),
        "compression": str(compression),
        "level": level if level is not None else DEFAULT_LEVELS.get(compression),
        "shard_bytes": shard_bytes if shards is None else None,
        "shard_records": shard_records,
        "shards": shards,
        "prefix": d.prefix,
        "read": repr(read),
        "manifests": d.manifests,
    }
    return Plan(
        directory=directory,
        state_folder=state_folder,
        store_config=store_config,
        files=files,
        units=units,
        setup=EncodeSetup(encoder, compression, level, read, batch_bytes),
        dataset=dataset,
        schema=encoder.schema_fingerprint(),
        prefix=d.prefix,
        shard_bytes=shard_bytes,
        shard_records=shard_records,
        shards=shards,
        manifests=d.manifests,
        fsync=d.fsync,
        workers=max(1, workers),
        args=args_of(plan_args, files),
    )
