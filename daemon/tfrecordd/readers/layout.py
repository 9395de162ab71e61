"""A dataset's published shards, its partitions and their completion markers.

A dataset is an output directory (a local path or an fsspec URL). Its shards sit at its root
(unpartitioned) or in Hive-style ``key=value`` folders (``dt=2026-11-25/hour=03``, and field
partitions below: ``…/country=de``). A shard is published once it exists under its final name
(``*.tfrecord``, ``*.tfrecord.gz``, ``*.tfrecord.zz``, ``*.tfrecord.zst``): shards are only ever
published whole, so listing needs no other guard. Its manifest (``*.manifest.json``) sits beside
it when manifests are on. A folder whose partition is complete holds a completion marker
(``_SUCCESS`` by default) listing every shard of the partition; a folder below it with no
marker of its own (a field partition of a marked time partition) is completed by it, and its
shards are listed by their path below the marker's folder. Names starting with ``.``
(in-progress files, the staging folder ``.unpublished``) or ``_`` (markers; the ``_late`` tree
of events that arrived after their partition was completed) are never shards.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import orjson

from tfrecordd.errors import TfrecorddError
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.outputs.manifest import manifest_name
from tfrecordd.readers.store import Folders, Store, subpath

MARKER_NAME = "_SUCCESS"
"""The completion marker's default file name."""

LATE_DIR = "_late"
"""The top-level folder holding, partition by partition, shards of late events."""

_SHARD_SUFFIXES = sorted(((s, c) for c, s in SUFFIXES.items()), key=lambda p: -len(p[0]))

TimeBound = dt.datetime | float | int
"""A time bound: an aware datetime, or epoch seconds (UTC)."""


def shard_compression(name: str) -> Compression | None:
    """The compression a shard's file name says, or ``None`` when the name is no shard's."""
    if name.startswith((".", "_")):
        return None
    for suffix, compression in _SHARD_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return compression
    return None


def partition_values(partition: str) -> dict[str, str]:
    """The ``key=value`` folders of a partition path as a dict (other folders are left out)."""
    pairs = (part.partition("=") for part in partition.split("/") if part)
    return {key: value for key, sep, value in pairs if sep}


@dataclass(frozen=True, slots=True)
class MarkedShard:
    """One shard as a completion marker lists it."""

    name: str
    records: int | None
    size: int | None
    sha256: str | None


@dataclass(frozen=True, slots=True)
class Marker:
    """A partition's completion marker: the partition is complete, and these are its shards."""

    path: str
    partition: str
    """The partition's folder, relative to the dataset (``""`` at its root)."""
    start: float | None
    """Start of the partition's time range ``[start, end)``, epoch seconds (UTC)."""
    end: float | None
    watermark: float | None
    """The event-time watermark that closed the partition, epoch seconds."""
    records: int | None
    shards: tuple[MarkedShard, ...]
    document: Mapping[str, Any] = field(compare=False, repr=False)
    """The whole marker as read, for fields this version does not name."""

    def listed(self) -> dict[str, MarkedShard]:
        """The listed shards by name."""
        return {s.name: s for s in self.shards}


@dataclass(frozen=True, slots=True)
class Shard:
    """A published shard of a dataset."""

    path: str
    """Its full path, or URL in the form the dataset's location was given."""
    name: str
    partition: str
    """Its partition's folder relative to the dataset (``"dt=2026-11-25/hour=03"``, ``""`` when
    unpartitioned); a late shard's is the partition it is late for."""
    compression: Compression
    size: int | None
    """Bytes on disk, as listed."""
    records: int | None
    """From its manifest, else from its partition's marker; ``None`` when neither says."""
    manifest: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """Its manifest, less ``record_offsets`` (read again when a reader seeks); ``None`` when it has
    none or manifests were not read."""
    marker: Marker | None = field(default=None, compare=False, repr=False)
    """The completion marker of its partition (or of the nearest folder above it), if the
    partition is complete."""
    late: bool = False
    """Whether it comes from the ``_late`` tree: written after its partition was completed."""

    @property
    def manifest_path(self) -> str:
        """Where its manifest is, or would be."""
        folder, sep, _ = self.path.rpartition("/")
        return f"{folder}{sep}{manifest_name(self.name)}"

    @property
    def partition_values(self) -> dict[str, str]:
        """Its partition's ``key=value`` folders as a dict."""
        return partition_values(self.partition)

    @property
    def event_time_range(self) -> tuple[float, float] | None:
        """``(min, max)`` event time of its records (epoch seconds), if its manifest says."""
        found = (self.manifest or {}).get("event_time_range")
        if not isinstance(found, list | tuple) or len(found) != 2:
            return None
        low, high = found
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
            return None
        return float(low), float(high)


def as_shard(shard: Shard | str | os.PathLike[str]) -> Shard:
    """``shard`` itself, or a path turned into a :class:`Shard` (no manifest read)."""
    if isinstance(shard, Shard):
        return shard
    path = os.fspath(shard)
    name = path.rstrip("/").rpartition("/")[2]
    compression = shard_compression(name) or Compression.NONE
    return Shard(
        path=path, name=name, partition="", compression=compression, size=None, records=None
    )


def _number(doc: Mapping[str, Any], key: str, where: str, kind: type = float) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise TfrecorddError(f"{where}: {key!r} is {value!r}, not a number")
    return kind(value)


def parse_marker(data: bytes, path: str, partition: str) -> Marker:
    """A completion marker's JSON read into a :class:`Marker`; ``path`` names it in errors."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TfrecorddError(f"{path}: the completion marker is not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise TfrecorddError(f"{path}: the completion marker holds no list of shards")
    shards = []
    for i, entry in enumerate(doc["shards"]):
        where = f"{path}: shards[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise TfrecorddError(f"{where} has no name")
        digest = entry.get("sha256")
        shards.append(
            MarkedShard(
                name=entry["name"],
                records=_number(entry, "records", where, int),
                size=_number(entry, "size", where, int),
                sha256=digest if isinstance(digest, str) else None,
            )
        )
    return Marker(
        path=path,
        partition=partition,
        start=_number(doc, "start", path),
        end=_number(doc, "end", path),
        watermark=_number(doc, "watermark", path),
        records=_number(doc, "records", path, int),
        shards=tuple(shards),
        document=doc,
    )


def manifest_document(data: bytes, path: str, shard: str) -> dict[str, Any]:
    """A manifest's JSON object, whole; it must be shard ``shard``'s."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TfrecorddError(f"{path}: the manifest is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TfrecorddError(f"{path}: the manifest is not a JSON object")
    if doc.get("shard", shard) != shard:
        raise TfrecorddError(f"{path}: the manifest is shard {doc['shard']!r}'s, not {shard!r}'s")
    return doc


def parse_manifest(data: bytes, path: str, shard: str) -> dict[str, Any]:
    """A manifest's JSON, less ``record_offsets``; it must be shard ``shard``'s."""
    doc = manifest_document(data, path, shard)
    doc.pop("record_offsets", None)
    _number(doc, "records", path, int)
    return doc


def _epoch(bound: TimeBound | None, what: str) -> float | None:
    if bound is None:
        return None
    if isinstance(bound, dt.datetime):
        if bound.tzinfo is None or bound.utcoffset() is None:
            raise TfrecorddError(
                f"{what} {bound.isoformat()} has no time zone: say which (tzinfo=datetime.UTC)"
            )
        return bound.timestamp()
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        raise TfrecorddError(f"{what} must be a datetime or epoch seconds, not {bound!r}")
    return float(bound)


def _selectors(partitions: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if partitions is None:
        return None
    if isinstance(partitions, str):
        partitions = (partitions,)
    return tuple(p.strip("/") for p in partitions)


def partition_selected(partition: str, selectors: Iterable[str]) -> bool:
    """Whether any selector matches ``partition``'s path or a leading run of its folders
    (``fnmatch`` patterns, case-sensitive; ``""`` matches only the dataset's root)."""
    parts = partition.split("/") if partition else []
    heads = ["/".join(parts[: i + 1]) for i in range(len(parts))] or [""]
    return any(fnmatchcase(head, s) for s in selectors for head in heads)


def _overlaps(
    low: float | None, high: float | None, lo: float | None, hi: float | None, *, closed: bool
) -> bool:
    """Whether ``[low, high]`` (``[low, high)`` unless ``closed``) meets ``[lo, hi)``; an unknown
    end of either reaches to infinity."""
    if hi is not None and low is not None and low >= hi:
        return False
    return lo is None or high is None or (high >= lo if closed else high > lo)


class _Listing:
    """One walk of a dataset, and the markers read from it."""

    def __init__(self, store: Store, folders: Folders, marker_name: str) -> None:
        self.store = store
        self.folders = folders
        self.marker_name = marker_name
        self._markers: dict[str, Marker | None] = {}

    def marker(self, folder: str) -> Marker | None:
        """The marker in ``folder`` itself, if there is one."""
        if folder not in self._markers:
            found = None
            if self.marker_name in self.folders.get(folder, {}):
                where = subpath(folder, self.marker_name)
                found = parse_marker(self.store.read(where), self.store.path(where), folder)
            self._markers[folder] = found
        return self._markers[folder]

    def covering(self, partition: str) -> tuple[Marker | None, str]:
        """The marker that completes ``partition`` and the folders below it that lead there:
        the partition's own, else the nearest one above it (a marker of a time partition
        lists the shards of its field partitions by their path below it)."""
        parts = partition.split("/") if partition else []
        for depth in range(len(parts), -1, -1):
            marker = self.marker("/".join(parts[:depth]))
            if marker is not None:
                return marker, "/".join(parts[depth:])
        return None, ""

    def manifest(self, folder: str, name: str) -> dict[str, Any] | None:
        wanted = manifest_name(name)
        if wanted not in self.folders.get(folder, {}):
            return None
        where = subpath(folder, wanted)
        return parse_manifest(self.store.read(where), self.store.path(where), name)


def list_shards(
    location: str | os.PathLike[str],
    *,
    partitions: Iterable[str] | str | None = None,
    start: TimeBound | None = None,
    end: TimeBound | None = None,
    completed_only: bool = False,
    include_late: bool = False,
    read_manifests: bool = True,
    marker_name: str = MARKER_NAME,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Shard]:
    """The published shards of the dataset at ``location``, sorted by partition, then name.

    In-progress files, the staging folder, manifests, markers and every other file that is not
    a shard are never listed. Partition folders are found at any depth.

    ``partitions``: keep only the partitions that one of these selects. Each is a folder path
    or an ``fnmatch`` pattern, matched against a partition's path and every leading run of its
    folders: ``"dt=2026-11-25"`` selects every hour of that day and their field partitions,
    ``"dt=*/hour=03"`` the third hour of every day, ``""`` the dataset's root (unpartitioned
    shards) only.

    ``start`` / ``end`` (aware datetimes or epoch seconds): keep only what overlaps
    ``[start, end)``: a partition with a marker by the marker's time range, a shard of a
    partition without one by its manifest's ``event_time_range``. A shard whose time is known
    from neither is kept: the filter never drops what it cannot place.

    ``completed_only``: only partitions with a completion marker (in their folder, or in the
    nearest folder above it), and in them only the shards the marker lists. ``include_late``:
    also the shards of the ``_late`` tree (events that arrived after their partition was
    completed), each with ``late=True`` and the partition it is late for; with
    ``completed_only``, those of completed partitions.

    ``read_manifests=False`` reads no manifest (faster on a large dataset in an object store;
    ``records`` then comes from the markers only); manifests are still read for the time
    filter where no marker gives a partition's time. ``marker_name``: the completion marker's
    file name (the dataset's ``completion.marker``). ``storage_options`` go to fsspec for a URL.

    Raises :class:`~tfrecordd.errors.InputError` when the location is no directory, and
    :class:`~tfrecordd.errors.TfrecorddError` on a damaged marker or manifest.
    """
    lo, hi = _epoch(start, "start"), _epoch(end, "end")
    if lo is not None and hi is not None and lo >= hi:
        raise TfrecorddError(f"start ({lo}) must be before end ({hi})")
    selectors = _selectors(partitions)

    def descend(folder: str) -> bool:
        name = folder.rpartition("/")[2]
        if name.startswith("_"):
            return include_late and folder == LATE_DIR
        return not name.startswith(".")

    store = Store(location, storage_options)
    listing = _Listing(store, store.walk(descend), marker_name)
    found: list[Shard] = []
    for folder, files in listing.folders.items():
        late = folder == LATE_DIR or folder.startswith(LATE_DIR + "/")
        partition = folder[len(LATE_DIR) + 1 :] if late else folder
        if selectors is not None and not partition_selected(partition, selectors):
            continue
        names = sorted(n for n in files if shard_compression(n) is not None)
        marker, below = listing.covering(partition) if names else (None, "")
        if not names or (completed_only and marker is None):
            continue
        timed = marker is None and (lo is not None or hi is not None)
        if marker is not None and not _overlaps(marker.start, marker.end, lo, hi, closed=False):
            continue
        listed = {} if marker is None or late else marker.listed()
        if completed_only and not late:
            names = [n for n in names if subpath(below, n) in listed]
        for name in names:
            manifest = listing.manifest(folder, name) if read_manifests or timed else None
            records = manifest.get("records") if manifest is not None else None
            if records is None and subpath(below, name) in listed:
                records = listed[subpath(below, name)].records
            shard = Shard(
                path=store.path(subpath(folder, name)),
                name=name,
                partition=partition,
                compression=shard_compression(name) or Compression.NONE,
                size=files[name],
                records=records,
                manifest=manifest,
                marker=marker,
                late=late,
            )
            span = shard.event_time_range if timed else None
            if span is not None and not _overlaps(span[0], span[1], lo, hi, closed=True):
                continue
            found.append(shard)
    found.sort(key=lambda s: (s.partition, s.late, s.name))
    return found
