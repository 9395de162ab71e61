"""What a command's arguments select: a dataset of the config, and the shards a tool reads.

``schema`` and the shard tools (``verify``, ``cat``, ``transcode``) take ``--config FILE
[--dataset NAME]``; :func:`choose_dataset` names the dataset (the only one, when ``--dataset``
is left out). The shard tools also take PATHs; :func:`select_shards` turns either form into the
shards to read: a dataset's published shards (:func:`tfrecordd.reader.list_shards`, which never
lists an in-progress, sidecar or marker file), narrowed by ``--partition`` and ``--completed``,
or the paths given, where a local directory holding partition folders (``dt=…``) stands for
the dataset it is. What the arguments leave open, or a name the config does not have, is a
:class:`UsageError` (exit 2) that lists what there is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfrecordd.errors import EXIT_USAGE, InputError, TfrecorddError
from tfrecordd.fsys import is_url
from tfrecordd.outputs import manifest
from tfrecordd.reader import MARKER_NAME, list_shards

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

__all__ = [
    "DatasetDir",
    "Selected",
    "Selection",
    "UsageError",
    "add_dataset_options",
    "add_selection_options",
    "choose_dataset",
    "is_dataset_dir",
    "manifest_path",
    "no_shards",
    "not_a_shard",
    "select_shards",
]


class UsageError(TfrecorddError):
    """The arguments leave open what to work on, or name what the config does not have."""

    exit_code = EXIT_USAGE


def choose_dataset(config: DaemonConfig, where: str, name: str | None) -> str:
    """The dataset ``--dataset`` names in ``config`` (read from ``where``), or its only one."""
    names = sorted(config.datasets)
    if name is None:
        if len(names) == 1:
            return names[0]
        raise UsageError(
            f"{where}: {len(names)} datasets, choose one with --dataset: {', '.join(names)}"
        )
    if name not in config.datasets:
        raise UsageError(f"{where}: no dataset {name!r} (datasets: {', '.join(names)})")
    return name


@dataclass(frozen=True, slots=True)
class DatasetDir:
    """A dataset's output directory, and what of it a command reads."""

    location: str
    """Its directory or fsspec URL, as configured or given."""
    name: str | None
    """The config's name for it; ``None`` for a directory given as a PATH."""
    marker_name: str = MARKER_NAME
    """Its completion markers' file name."""
    partitions: tuple[str, ...] | None = None
    """``--partition`` selectors (folder paths or patterns); ``None``: every partition."""
    completed: bool = False
    """``--completed``: only completed partitions, and in them only the shards listed."""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    sequence: bool = False
    """Whether its encoder writes ``SequenceExample`` records (its schema says so)."""


@dataclass(frozen=True, slots=True)
class Selected:
    """One shard to read."""

    path: str
    partition: str = ""
    """Its partition folder, relative to its dataset (``""``: a PATH, or unpartitioned;
    ``_late/<partition>`` for a late shard)."""


@dataclass(slots=True)
class Selection:
    """What a tool reads: the shards, the paths it skipped with why, and the datasets."""

    shards: list[Selected]
    skipped: list[dict[str, str]]
    datasets: list[DatasetDir]


def add_dataset_options(p: argparse.ArgumentParser, *, config_required: bool = False) -> None:
    """``--config FILE`` and ``--dataset NAME`` on the parser ``p``."""
    p.add_argument(
        "--config",
        "-c",
        required=config_required,
        metavar="FILE",
        help="the daemon's TOML config" + ("" if config_required else ": read its dataset"),
    )
    p.add_argument(
        "--dataset",
        metavar="NAME",
        help="the [datasets.NAME] of the config (default: its only one)",
    )


def add_selection_options(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--dataset``, ``--partition`` and ``--completed`` on a tool's parser."""
    add_dataset_options(p)
    p.add_argument(
        "--partition",
        action="append",
        metavar="P",
        help="only this partition folder or pattern, e.g. 'dt=2026-11-25' or 'dt=*/hour=03' "
        "(repeatable; with --config or a dataset directory)",
    )
    p.add_argument(
        "--completed",
        action="store_true",
        help="only completed partitions, and in them only the shards their marker lists",
    )


def is_dataset_dir(path: str) -> bool:
    """Whether ``path`` is a local directory holding partition folders (``key=value``)."""
    if is_url(path) or not os.path.isdir(path):
        return False
    try:
        with os.scandir(path) as entries:
            return any(
                "=" in e.name and not e.name.startswith((".", "_")) and e.is_dir() for e in entries
            )
    except OSError:
        return False


def manifest_path(path: str) -> str:
    """Where the manifest of the shard at ``path`` is, or would be."""
    return os.path.join(os.path.dirname(path), manifest.manifest_name(os.path.basename(path)))


def not_a_shard(path: str, given: set[str], *, checks_manifests: bool = True) -> str | None:
    """Why ``path`` (one of the paths ``given`` on the command line) is no shard to read, or
    ``None``: what a glob such as ``shards/*`` also picks up beside the shards.
    ``checks_manifests``: whether the command compares each shard with its manifest (``verify``
    does unless ``--no-manifest``; ``cat`` and ``transcode`` only read the shard)."""
    name = os.path.basename(path.rstrip("/"))
    if name.endswith(manifest.SUFFIX):
        shard = next((g for g in given if manifest_path(g) == path and g != path), None)
        if not checks_manifests:
            read = f" (its shard {shard} is read)" if shard else ""
            return f"a manifest, not a shard{read}"
        return (
            f"a manifest, checked with its shard {shard}"
            if shard
            else "a manifest, not a shard: give its shard to check both"
        )
    if name.endswith(".inprogress"):
        return "a file still being written (not published)"
    return None


def _configured(args: argparse.Namespace) -> DatasetDir:
    # Imported here: the config pulls in pydantic and the plugin registry, which a tool given
    # only PATHs never needs (it starts three times faster without).
    from tfrecordd.config import load_config
    from tfrecordd.schema import SequenceSchema

    config = load_config(args.config)
    name = choose_dataset(config, args.config, args.dataset)
    dataset = config.datasets[name]
    schema = config.encoders[dataset.encoder].declared_schema()
    return DatasetDir(
        location=dataset.dir,
        name=name,
        marker_name=dataset.completion.marker if dataset.completion else MARKER_NAME,
        partitions=tuple(args.partition) if args.partition else None,
        completed=args.completed,
        storage_options=dataset.storage_options,
        sequence=isinstance(schema, SequenceSchema),
    )


def _listed(d: DatasetDir, *, late: bool) -> list[Selected]:
    shards = list_shards(
        d.location,
        partitions=d.partitions,
        completed_only=d.completed,
        include_late=late,
        read_manifests=False,
        marker_name=d.marker_name,
        storage_options=d.storage_options,
    )
    return [Selected(s.path, s.partition if not s.late else f"_late/{s.partition}") for s in shards]


def select_shards(
    args: argparse.Namespace,
    paths: list[str],
    *,
    late: bool = False,
    listing_errors: list[str] | None = None,
) -> Selection:
    """The shards a tool's arguments name: PATHs (each directory holding partition folders
    standing for its dataset's shards), or ``--config``'s dataset; ``late``: the shards of the
    datasets' ``_late`` trees too. Each path that is no shard is noted on stderr with why.

    Raises :class:`UsageError` when the arguments leave the choice open, and
    :class:`~tfrecordd.errors.InputError` when nothing is left to read. A dataset that cannot be
    listed (a damaged marker) raises its error, or with ``listing_errors`` adds it there."""
    if args.config is None:
        if args.dataset is not None:
            raise UsageError("--dataset NAME needs --config FILE")
        if not paths:
            raise UsageError("give shard PATHs, or --config FILE [--dataset NAME]")
    elif paths:
        raise UsageError("give shard PATHs or --config FILE, not both")
    selectors = tuple(args.partition) if args.partition else None
    if args.config is not None:
        selection = Selection([], [], [_configured(args)])
    else:
        selection = Selection([], [], [])
        given = set(paths)
        for path in paths:
            if is_dataset_dir(path):
                d = DatasetDir(path, None, partitions=selectors, completed=args.completed)
                selection.datasets.append(d)
                continue
            # Only verify has --no-manifest; it compares shards with their manifests without it.
            checks = getattr(args, "no_manifest", True) is False
            why = not_a_shard(path, given, checks_manifests=checks)
            if why is None:
                selection.shards.append(Selected(path))
            else:
                selection.skipped.append({"path": path, "reason": why})
                print(f"tfrecordd: skipping {path}: {why}", file=sys.stderr)
        if (selectors or args.completed) and not selection.datasets:
            raise UsageError(
                "--partition and --completed choose among a dataset's shards: "
                "give --config FILE or a dataset directory"
            )
    for d in selection.datasets:
        try:
            selection.shards += _listed(d, late=late)
        except (InputError, UsageError):
            raise
        except TfrecorddError as e:
            if listing_errors is None:
                raise
            listing_errors.append(f"{d.location}: cannot be listed: {e}")
    if not selection.shards and not selection.datasets:
        raise InputError(" ".join(paths), "no shard among the paths given")
    return selection


def no_shards(selection: Selection) -> InputError:
    """The error of a selection of datasets that holds no shard."""
    where = ", ".join(d.location for d in selection.datasets)
    chosen = [
        f"partitions {', '.join(d.partitions)}" for d in selection.datasets if d.partitions
    ] + (["completed partitions"] if any(d.completed for d in selection.datasets) else [])
    return InputError(where, "no published shard" + (f" in {'; '.join(chosen)}" if chosen else ""))
