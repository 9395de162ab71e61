"""Datasets: a schema (an encoder) and the output its records go to, alone.

A dataset is ``[datasets.NAME]``: the name of its ``[encoders.NAME]`` table, every key of an
output (where, compression, caps), how its shards are laid out in partitions
(``[datasets.NAME.partition]``) and whether a partition is marked complete
(``[datasets.NAME.completion]``). Records of two datasets never share a shard. A source feeds one
dataset (``dataset = "NAME"``), or routes each event to one of several by the value of one field
(``[sources.route]``).

The form older configs use, one ``[output]`` and ``encoder = "NAME"`` on each source, is one
dataset named after that encoder (:func:`legacy_dataset`).
"""

from __future__ import annotations

import re
import zoneinfo
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tfrecordd.format.compression import Compression
from tfrecordd.units import Duration, Size

__all__ = [
    "CompletionSection",
    "DatasetSection",
    "OutputSection",
    "PartitionSection",
    "RouteSection",
    "legacy_dataset",
]

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
"""Dataset names are metric labels and state keys: letters, digits, ``_``, ``.`` and ``-``."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class OutputSection(_Section):
    """``[output]``: where shards go and when they rotate (also every ``[datasets.NAME]``)."""

    dir: str
    """Where shards are published: a local directory, or an fsspec URL such as
    ``s3://bucket/prefix`` or ``gs://bucket/prefix`` (see ``storage_options``)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """Passed as they are to the fsspec file system of a URL ``dir`` (endpoint, region...).
    Prefer credentials from the environment; values here are never logged, and
    ``check-config`` prints each as ``***`` unless its key is known to be harmless
    (``endpoint_url``, ``region_name``, ``anon``...)."""
    staging_dir: Path | None = None
    """For a URL ``dir``: the local directory where shards are written before upload, in a
    subfolder named after ``node_id``. Default: ``staging/`` in ``state_dir`` (for a dataset:
    ``staging/<dataset>/``)."""
    compression: Compression = Compression.GZIP
    """``none``, ``gzip``, ``zlib`` (all read by ``tf.data``) or ``zstd`` (tfrecordd's reader)."""
    level: int | None = None
    """Compression level; default: gzip/zlib 6, zstd 3."""
    max_shard_bytes: Size = Field(default=256 << 20, ge=4096)
    """Rotate before a shard's size on disk (compressed) would pass this. Only a shard holding a
    single batch larger than this on its own may exceed it."""
    max_shard_records: int = Field(default=0, ge=0)
    """Rotate at this many records; 0: no limit."""
    max_shard_age: Duration = Field(default=600.0, gt=0)
    """A shard holding data is published at most this long after its first record arrived."""
    prefix: str = Field(default="part", pattern=r"^[A-Za-z0-9_.-]+$")
    """The first part of each shard's name."""
    min_free_bytes: Size = Field(default=64 << 20, ge=0)
    """Keep this much space free on the output's file system: before a batch is written, the
    daemon waits (its sources paused by backpressure) until the batch fits above this reserve,
    and resumes by itself when space returns. ``0`` turns the check off."""
    verify: Literal["sha256", "size"] = "sha256"
    """For a URL ``dir``: after each upload compare the object's size and read it back to
    compare its SHA-256 (``sha256``), or compare the size only (``size``: no download)."""
    retry_for: Duration = Field(default=300.0, gt=0)
    """For a URL ``dir``: how long one upload rides out transient errors (with backoff)
    before the daemon stops; during a drain, no longer than what is left of
    ``daemon.drain_timeout``."""
    manifests: bool = True
    """Publish a manifest beside each shard (``<name>.manifest.json``: record count and
    offsets, CRC32C and SHA-256, schema hash, dataset, partition, time ranges, source
    positions)."""
    fsync: bool = True
    """fsync shards, the journal and directories. Turning this off gives up every durability
    promise across power loss (kill -9 stays safe); for tests and throwaway data only."""


_SAFE_FIELD = re.compile(r"^[A-Za-z0-9_]+$")


class PartitionSection(_Section):
    """``[datasets.NAME.partition]``: shards laid out in Hive-style folders
    (``dt=2026-11-25/hour=03/country=de/``) by time and by the values of fields."""

    time: Literal["event", "arrival", "none"] = "none"
    """Folders by the event's own time (``event``: the feature ``time_field``), by the time the
    daemon read the event (``arrival``), or none."""
    time_field: str | None = None
    """For ``time = "event"``: the schema's feature that holds the event's time: an ``int64``
    feature with ``time_unit`` (its value is read in that unit), or a ``bytes`` feature of
    RFC 3339 text."""
    granularity: Literal["hour", "day"] = "hour"
    """One folder per hour (``dt=YYYY-MM-DD/hour=HH``) or per day (``dt=YYYY-MM-DD``)."""
    zone: str = "UTC"
    """The IANA time zone the folders' dates and hours are in. Across a daylight-saving change
    no hour is lost and none is shared: the second pass of a repeated hour on the day clocks go
    back is ``hour=HH+hhmm`` (its UTC offset), e.g. ``hour=02+0100``."""
    fields: list[str] = Field(default_factory=list)
    """Features of bounded cardinality whose values become folders after the time ones
    (``country=de``), in this order."""
    max_partitions: int = Field(default=1000, ge=1)
    """The most distinct values of ``fields`` (combined) given folders of their own; values
    beyond, and values that are not a safe folder name (letters, digits, ``_``, ``.``, ``-``,
    at most 64 characters, not starting with ``.`` or ``_``), go to ``FIELD=_other``, counted
    in ``tfrecordd_partition_fallbacks_total``."""

    @field_validator("zone")
    @classmethod
    def _check_zone(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(f"unknown IANA time zone {v!r}") from e
        return v

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _SAFE_FIELD.match(name):
                raise ValueError(f"field {name!r}: a folder key must be letters, digits and _")
            if name in ("dt", "hour"):
                raise ValueError(f"field {name!r}: the time folders' own key")
        if len(set(v)) != len(v):
            raise ValueError("a field is listed twice")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PartitionSection:
        if self.time == "event" and not self.time_field:
            raise ValueError('time = "event" needs time_field (the feature holding the time)')
        if self.time != "event" and self.time_field:
            raise ValueError('time_field is read only with time = "event"')
        if self.time_field in self.fields:
            raise ValueError(f"{self.time_field!r} is both the time field and a folder field")
        return self

    @property
    def partitioned(self) -> bool:
        """Whether shards go to folders at all."""
        return self.time != "none" or bool(self.fields)


class CompletionSection(_Section):
    """``[datasets.NAME.completion]``: a marker published in each time partition once it can
    receive no more events, listing every shard it holds (for schedulers: an Airflow sensor, a
    cron job)."""

    marker: str = Field(default="_SUCCESS", pattern=r"^_[A-Za-z0-9_.-]+$")
    """The marker's file name; it starts with ``_`` so that no shard glob matches it."""
    allowed_lateness: Duration = 0.0
    """How far behind the newest event time (the watermark) an event may come and still go
    to its partition: a partition closes once the newest event time, less this, has passed
    its end."""
    idle_close: Duration = Field(default=300.0, gt=0)
    """When no event has come for this long, the watermark moves on with the clock: a
    partition closes even if no newer event ever comes."""
    late: Literal["dead-letter", "late-partition"] = "dead-letter"
    """An event whose partition is already marked complete: dead-lettered with the reason
    ``late``, or written under ``_late/<partition>/`` (a tree no ``dt=*`` glob reaches)."""


class DatasetSection(OutputSection):
    """``[datasets.NAME]``: one schema and its own output."""

    encoder: str
    """The ``[encoders.NAME]`` table whose schema every record of this dataset has."""
    max_open_shards: int = Field(default=32, ge=1)
    """The most shards of this dataset open at once (one per partition written to); at the
    cap, the least recently written is published to make room (never dropped)."""
    partition: PartitionSection = PartitionSection()
    """How shards are laid out in folders (default: all in ``dir``)."""
    completion: CompletionSection | None = None
    """Publish completion markers in time partitions (default: none)."""

    @model_validator(mode="after")
    def _completion_needs_time(self) -> DatasetSection:
        if self.completion is not None and self.partition.time == "none":
            raise ValueError(
                "completion markers close time partitions: set partition.time to "
                '"event" or "arrival"'
            )
        return self


class RouteSection(_Section):
    """``[sources.route]``: each event goes to the dataset its ``field`` names."""

    field: str = Field(min_length=1)
    """The top-level field of each event (a JSON object's key, a CSV column, or a whole-file
    event's ``label``, its folder) whose value picks the dataset."""
    to: dict[str, str] = Field(min_length=1)
    """Value → dataset name. Values are compared as text: ``1`` and ``"1"`` are one value,
    ``true`` is ``"true"``."""
    default: str | None = None
    """The dataset of events whose value is missing or not in ``to``; unset: such events are
    dead-lettered with the reason ``route``. (An event that is not JSON fails as ``malformed``
    instead, wherever every dataset of the route parses JSON: see docs/datasets.md.)"""


def legacy_dataset(output: OutputSection, encoder: str) -> DatasetSection:
    """The dataset that a config of the older form (``[output]``, ``encoder`` on sources) is."""
    return DatasetSection(encoder=encoder, **output.model_dump(exclude_unset=True))
