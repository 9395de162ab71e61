"""The daemon's configuration: TOML validated in two phases, every error reported at once.

Phase one checks the shared sections (``[daemon]``, ``[metrics]``, ``[output]``) and the keys
every source shares; phase two checks each source and encoder against its plugin's own model.
Unknown keys are errors everywhere. Every problem is collected, with its location, into one
:class:`~tfrecordd.errors.ConfigError`.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
)

from tfrecordd.endpoints import METRICS_LISTEN, split_host_port
from tfrecordd.errors import ConfigError
from tfrecordd.format.compression import Compression
from tfrecordd.pathcheck import check_paths
from tfrecordd.plugin import EncoderConfig, Registry, SourceConfig
from tfrecordd.units import Duration, Size


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class DaemonSection(_Section):
    """``[daemon]``: identity, state and shutdown."""

    node_id: str = Field(default_factory=socket.gethostname, pattern=r"^[A-Za-z0-9_.-]+$")
    """This daemon's id in shard names and claims; unique among daemons sharing an output or a
    spool (a second daemon with the same id on one output or one spool exits with status 75).
    Default: the host name."""
    state_dir: Path = Path("/var/lib/tfrecordd")
    """Where the journal, the checkpoint, source state and the dead letters live. One daemon
    per ``state_dir``: a second one started on it exits with status 75."""
    drain_timeout: Duration = 30.0
    """On SIGTERM, how long to drain the pipeline and publish open shards before exiting."""
    encode_workers: int = Field(default=1, ge=1, le=256)
    """Encode with this many encoders at once: a thread of the daemon and ``N - 1`` worker
    processes (``1``: the thread alone); one per core is the rule. Encoders also frame and
    compress each batch of 64 KiB or more, so both grow with cores; batches still reach the
    shards in the order they were read."""
    queue_batches: int = Field(default=16, ge=1)
    """Capacity, in batches, of each stream between stages; a full stream pauses the sources."""
    max_batch_events: int = Field(default=1000, ge=1)
    """The most events a source puts in one batch."""
    max_batch_bytes: Size = Field(default=1 << 20, ge=1)
    """The payload bytes a source aims to keep one batch under (one large event may exceed)."""
    dead_letter_max_bytes: Size = Field(default=64 << 20, ge=1024)
    """Size of the dead-letter file before it rotates (``dead-letters.jsonl.1`` keeps the previous
    one; older ones are deleted and counted in ``tfrecordd_dead_letters_discarded_total``)."""
    log_format: Literal["auto", "text", "json"] = "auto"
    """Log lines as text or JSON; ``auto``: JSON under systemd's journal, text otherwise."""

    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, v: str) -> str:
        # The id names this node's staging folder: "." or ".." would be another folder's name.
        if v in (".", ".."):
            raise ValueError(f"must not be {v!r}")
        return v


class MetricsSection(_Section):
    """``[metrics]``: the Prometheus endpoint (``/metrics``) and liveness check (``/healthz``)."""

    enabled: bool = True
    """Serve metrics at all."""
    listen: str = METRICS_LISTEN
    """``host:port`` to listen on (``[::1]:9464`` for IPv6); loopback unless you choose else."""

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        split_host_port(v)
        return v


class OutputSection(_Section):
    """``[output]``: where shards go and when they rotate."""

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
    subfolder named after ``node_id``. Default: ``staging/`` in ``state_dir``."""
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
    offsets, CRC32C and SHA-256, schema hash, time range, source positions)."""
    fsync: bool = True
    """fsync shards, the journal and directories. Turning this off gives up every durability
    promise across power loss (kill -9 stays safe); for tests and throwaway data only."""


class DaemonConfig(_Section):
    """The whole configuration, validated."""

    daemon: DaemonSection = DaemonSection()
    metrics: MetricsSection = MetricsSection()
    output: OutputSection
    sources: list[SerializeAsAny[SourceConfig]]
    """``[[sources]]``: each validated by its plugin's model (``type``)."""
    encoders: dict[str, SerializeAsAny[EncoderConfig]]
    """``[encoders.NAME]``: each validated by its plugin's model (``type``)."""
    path: Path | None = None
    """The file this config was read from, if any."""


class _Shape(_Section):
    daemon: DaemonSection = DaemonSection()
    metrics: MetricsSection = MetricsSection()
    output: OutputSection
    sources: list[dict[str, Any]] = Field(min_length=1)
    encoders: dict[str, dict[str, Any]] = Field(default_factory=dict)


class _SourceCommon(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    type: str
    encoder: str


def _loc(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _messages(e: ValidationError, prefix: str = "", suffix: str = "") -> list[str]:
    msgs = []
    for err in e.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif (
            err["type"] not in ("missing", "value_error")
            and "input" in err
            and not isinstance(err["input"], dict)
        ):
            msg += f" (got {err['input']!r})"
        msgs.append(f"{_loc(prefix, err['loc'])}: {msg}{suffix}")
    return msgs


def _unknown(kind: str, name: object, registry: Registry) -> str:
    group = f"tfrecordd.{kind}s"
    if (error := registry.broken.get(f"{group}:{name}")) is not None:
        return f"the {kind} plugin {name!r} is installed but failed to load: {error}"
    known = ", ".join(sorted(registry.sources if kind == "source" else registry.encoders))
    return f"unknown {kind} type {name!r} (known: {known or 'none installed'})"


def parse_config(
    data: dict[str, Any], registry: Registry, path: Path | None = None
) -> DaemonConfig:
    """Validate a decoded config; raises :class:`ConfigError` listing every problem."""
    errors: list[str] = []
    try:
        shape = _Shape.model_validate(data)
    except ValidationError as e:
        errors.extend(_messages(e))
        shape = None
    raw_sources = data.get("sources") if isinstance(data.get("sources"), list) else []
    raw_encoders = data.get("encoders") if isinstance(data.get("encoders"), dict) else {}

    encoders: dict[str, EncoderConfig] = {}
    for name, raw in (raw_encoders or {}).items():
        if not isinstance(raw, dict):
            continue
        kind = raw.get("type")
        emodel = registry.encoders.get(kind) if isinstance(kind, str) else None
        if emodel is None:
            errors.append(f"encoders.{name}.type: {_unknown('encoder', kind, registry)}")
            continue
        try:
            encoders[name] = emodel.model_validate(raw)
        except ValidationError as e:
            errors.extend(_messages(e, f"encoders.{name}", f" [encoder {name!r}, type {kind!r}]"))

    sources: list[SourceConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_sources or []):
        if not isinstance(raw, dict):
            continue
        try:
            common = _SourceCommon.model_validate(raw)
        except ValidationError as e:
            errors.extend(_messages(e, f"sources[{i}]"))
            continue
        where = f" [source {common.name!r}, type {common.type!r}]"
        model = registry.sources.get(common.type)
        if model is None:
            errors.append(f"sources[{i}].type: {_unknown('source', common.type, registry)}")
            continue
        if common.name in seen:
            errors.append(f"sources[{i}].name: duplicate source name {common.name!r}")
        seen.add(common.name)
        if common.encoder not in (raw_encoders or {}):
            errors.append(f"sources[{i}].encoder: no [encoders.{common.encoder}] table{where}")
        try:
            source = model.model_validate(raw)
        except ValidationError as e:
            errors.extend(_messages(e, f"sources[{i}]", where))
        else:
            sources.append(source)
            encoder = (raw_encoders or {}).get(common.encoder)
            errors.extend(_record_limit_errors(i, source, encoder, where))

    if errors or shape is None:
        raise ConfigError(errors)
    try:
        config = DaemonConfig(
            daemon=shape.daemon,
            metrics=shape.metrics,
            output=shape.output,
            sources=sources,
            encoders=encoders,
            path=path,
        )
    except ValidationError as e:  # pragma: no cover - the parts were validated above
        raise ConfigError(_messages(e)) from e
    if overlaps := check_paths(config):
        raise ConfigError(overlaps)
    return config


MAX_PARSEABLE_RECORD_BYTES = (1 << 31) - 1
"""Protobuf parses no message of 2 GiB or more: nor do ``tf.io.parse_example`` and the tools."""

_WHOLE_EVENT_ENCODERS = ("passthrough", "image")
"""Encoders that write each event's bytes whole into its record."""


def _record_limit_errors(i: int, source: SourceConfig, encoder: Any, where: str) -> list[str]:
    """A source's event limit checked with its encoder: where each event goes whole into a
    record, a limit past what any reader parses would let the daemon write records nobody can
    parse (the daemon itself reads back any record it wrote)."""
    if not isinstance(encoder, dict) or encoder.get("type") not in _WHOLE_EVENT_ENCODERS:
        return []
    keys = ["max_event_bytes", "max_frame_bytes"]
    keys.append(
        "max_file_bytes" if getattr(source, "format", None) == "whole-file" else "max_line_bytes"
    )
    out = []
    for key in keys:
        value = getattr(source, key, None)
        if isinstance(value, int) and value > MAX_PARSEABLE_RECORD_BYTES:
            out.append(
                f"sources[{i}].{key}: {value} bytes is over {MAX_PARSEABLE_RECORD_BYTES}: encoder "
                f"{source.encoder!r} (type {encoder['type']!r}) writes each event whole into one "
                "record, and neither TensorFlow nor protobuf parses a record of 2 GiB or more"
                f"{where}"
            )
    return out


def load_config(path: str | os.PathLike[str], registry: Registry | None = None) -> DaemonConfig:
    """Read and validate a TOML config file; raises :class:`ConfigError` on any problem."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError([f"{p}: cannot read: {e.strerror or e}"]) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{p}: not valid TOML: {e}"]) from e
    return parse_config(data, registry or Registry.from_entry_points(), p)
