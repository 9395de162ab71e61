"""A completed partition checked against its completion marker."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from tfrecordd.errors import InputError
from tfrecordd.outputs.manifest import manifest_name
from tfrecordd.readers.layout import (
    MARKER_NAME,
    parse_manifest,
    parse_marker,
    shard_compression,
)
from tfrecordd.readers.store import Store, subpath


def _sha256(store: Store, relative: str) -> str:
    digest = hashlib.sha256()
    with store.open(relative) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _is_shard_path(path: str) -> bool:
    parts = path.split("/")
    return (
        shard_compression(parts[-1]) is not None
        and "" not in parts
        and not any(p.startswith((".", "_")) for p in parts)
    )


def check_partition(
    folder: str | os.PathLike[str],
    *,
    marker_name: str = MARKER_NAME,
    verify_digests: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """What is wrong with the completed partition in ``folder`` (empty when nothing is).

    ``folder`` is the folder of one partition (``<dataset>/dt=…/hour=03``, or a field partition
    below it) and holds its marker. The partition's shards are those of the folder, and of the
    folders below it that have no marker of their own (the marker lists those by their path
    below ``folder``). Each problem is a line naming the shard: no marker (the partition is not
    complete); a listed shard missing; a size, SHA-256 (read whole when ``verify_digests``) or
    record count (from the shard's manifest) other than the marker says; a shard present that
    the marker does not list; the marker's total of records not the sum of its shards'.
    Raises :class:`~tfrecordd.errors.InputError` when ``folder`` is no directory and
    :class:`~tfrecordd.errors.TfrecorddError` when the marker is not one.
    """
    store = Store(folder, storage_options)
    folders = store.walk(lambda sub: not sub.rpartition("/")[2].startswith((".", "_")))
    if marker_name not in folders[""]:
        return [f"no {marker_name} marker: the partition is not complete"]
    marker = parse_marker(store.read(marker_name), store.path(marker_name), "")
    own = [f for f, files in folders.items() if f and marker_name in files]
    files = {
        subpath(f, name): size
        for f, names in folders.items()
        if not any(f == o or f.startswith(o + "/") for o in own)
        for name, size in names.items()
    }
    present = {path: size for path, size in files.items() if _is_shard_path(path)}
    problems: list[str] = []
    seen: set[str] = set()
    for entry in marker.shards:
        name = entry.name
        if name in seen:
            problems.append(f"{name}: listed twice in {marker_name}")
            continue
        seen.add(name)
        if name not in present:
            what = "missing" if _is_shard_path(name) else "not a shard's name"
            problems.append(f"{name}: listed in {marker_name} but {what}")
            continue
        if entry.size is not None and present[name] != entry.size:
            problems.append(f"{name}: size {present[name]}, {marker_name} says {entry.size}")
        if verify_digests and entry.sha256 is not None:
            try:
                actual = _sha256(store, name)
            except InputError as e:
                problems.append(f"{name}: cannot be read: {e.detail}")
                continue
            if actual != entry.sha256:
                problems.append(f"{name}: SHA-256 {actual}, {marker_name} says {entry.sha256}")
        below, _, base = name.rpartition("/")
        sidecar = subpath(below, manifest_name(base))
        if entry.records is not None and sidecar in files:
            doc = parse_manifest(store.read(sidecar), store.path(sidecar), base)
            if doc.get("records") != entry.records:
                problems.append(
                    f"{name}: {doc.get('records')} records in its manifest, "
                    f"{marker_name} says {entry.records}"
                )
    for name in sorted(set(present) - seen):
        problems.append(f"{name}: in the folder but not listed in {marker_name}")
    counts = [s.records for s in marker.shards]
    if marker.records is not None and None not in counts:
        total = sum(c for c in counts if c is not None)
        if total != marker.records:
            problems.append(
                f"{marker_name}: {marker.records} records in all, its shards hold {total}"
            )
    return problems
