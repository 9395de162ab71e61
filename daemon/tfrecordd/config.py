"""The daemon's configuration: TOML validated in two phases, every error reported at once.

Phase one checks the shared sections (``[daemon]``, ``[metrics]``, ``[output]``) and the keys
every source shares; phase two checks each source and encoder against its plugin's own model.
Unknown keys are errors everywhere. Every problem is collected, with its location, into one
:class:`~tfrecordd.errors.ConfigError`.
"""

from __future__ import annotations

import itertools
import os
import re
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

from tfrecordd.datasets import NAME_PATTERN, DatasetSection, OutputSection, legacy_dataset
from tfrecordd.endpoints import METRICS_LISTEN, split_host_port
from tfrecordd.errors import ConfigError, ConfigFileError
from tfrecordd.fsys import is_url
from tfrecordd.interpolate import interpolate
from tfrecordd.pathcheck import check_paths
from tfrecordd.plugin import EncoderConfig, Registry, SourceConfig
from tfrecordd.suggest import choices, did_you_mean, known_keys
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
    max_batch_events: int = Field(default=4096, ge=1)
    """The most events a source puts in one batch (``max_batch_bytes`` bounds it as well).
    Large batches matter most where a batch is split: routed into datasets and partitions, each
    part of a batch costs the writer a step of its own."""
    max_batch_bytes: Size = Field(default=1 << 20, ge=1)
    """The payload bytes a source aims to keep one batch under (one large event may exceed)."""
    dead_letter_max_bytes: Size = Field(default=64 << 20, ge=1024)
    """Size of the dead-letter file before it rotates (``dead-letters.jsonl.1`` keeps the previous
    one; older ones are deleted and counted in ``tfrecordd_dead_letters_discarded_total``)."""
    log_format: Literal["auto", "text", "json"] = "auto"
    """Log lines as text or JSON; ``auto``: JSON under systemd's journal, text otherwise."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe log lines written (``run --log-level`` overrides it)."""

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


class DaemonConfig(_Section):
    """The whole configuration, validated."""

    daemon: DaemonSection = DaemonSection()
    metrics: MetricsSection = MetricsSection()
    output: OutputSection | None = None
    """``[output]``, in the older form of a config (one dataset, ``encoder`` on each source);
    ``None`` in a config with ``[datasets]``."""
    datasets: dict[str, DatasetSection]
    """``[datasets.NAME]``; a config of the older form has one, named after its encoder."""
    sources: list[SerializeAsAny[SourceConfig]]
    """``[[sources]]``: each validated by its plugin's model (``type``)."""
    encoders: dict[str, SerializeAsAny[EncoderConfig]]
    """``[encoders.NAME]``: each validated by its plugin's model (``type``)."""
    path: Path | None = None
    """The file this config was read from, if any."""

    def dataset_key(self, name: str) -> str:
        """Where dataset ``name`` is configured, for messages: ``output`` in the older form."""
        return "output" if self.output is not None else f"datasets.{name}"

    def staging_root(self, name: str) -> Path:
        """For a dataset with a URL ``dir``: the local folder under which each node stages its
        shards (``staging_dir``, else ``state_dir/staging``, then ``/<dataset>`` with
        ``[datasets]``: two datasets never share one)."""
        dataset = self.datasets[name]
        root = dataset.staging_dir or Path(self.daemon.state_dir) / "staging"
        return root if self.output is not None else root / name

    def fed_datasets(self, source: SourceConfig) -> list[str]:
        """The datasets ``source``'s events may go to."""
        if source.route is None and source.dataset is None:
            return list(self.datasets)  # the older form: its one dataset
        return _fed(source)


class _Shape(_Section):
    daemon: DaemonSection = DaemonSection()
    metrics: MetricsSection = MetricsSection()
    output: OutputSection | None = None
    datasets: dict[str, DatasetSection] = Field(default_factory=dict)
    sources: list[dict[str, Any]] = Field(min_length=1)
    encoders: dict[str, dict[str, Any]] = Field(default_factory=dict)


class _SourceCommon(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    type: str


def _loc(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _messages(
    e: ValidationError, prefix: str = "", suffix: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    msgs = []
    for err in e.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(
                str(err["loc"][-1]), known_keys(model, err["loc"][:-1])
            )
        elif (
            err["type"] not in ("missing", "value_error")
            and "input" in err
            and not isinstance(err["input"], dict)
        ):
            msg += f" (got {err['input']!r})"
            if err["type"] in ("literal_error", "enum") and isinstance(err["input"], str):
                msg += did_you_mean(err["input"], choices(str(err.get("ctx", {}).get("expected"))))
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
        errors.extend(_messages(e, model=_Shape))
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
            where = f" [encoder {name!r}, type {kind!r}]"
            errors.extend(_messages(e, f"encoders.{name}", where, emodel))

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
        if common.name in (".", ".."):  # it names the source's folder in state_dir/sources/
            errors.append(f"sources[{i}].name: must not be {common.name!r}")
        seen.add(common.name)
        try:
            source = model.model_validate(raw)
        except ValidationError as e:
            errors.extend(_messages(e, f"sources[{i}]", where, model))
        else:
            sources.append(source)

    if shape is None:
        # The shared sections are broken: the references between the rest are still checked,
        # so that every error is told at once.
        tables = {
            "encoder": raw_encoders or {},
            "dataset": data.get("datasets") if isinstance(data.get("datasets"), dict) else {},
        }
        for i, raw in enumerate(raw_sources or []):
            if not isinstance(raw, dict):
                continue
            where = f" [source {raw.get('name')!r}, type {raw.get('type')!r}]"
            for key, known in tables.items():
                name = raw.get(key)
                if isinstance(name, str) and name not in (known or {}):
                    errors.append(f"sources[{i}].{key}: no [{key}s.{name}] table{where}")
        raise ConfigError(errors)
    datasets = _datasets(shape, sources, raw_encoders or {}, errors)
    for i, source in enumerate(sources):
        where = f" [source {source.name!r}, type {source.type!r}]"
        for name in _fed(source) or list(datasets):
            dataset = datasets.get(name)
            encoder = (raw_encoders or {}).get(dataset.encoder) if dataset else None
            errors.extend(_record_limit_errors(i, source, encoder, dataset, where))
    if errors:
        raise ConfigError(errors)
    try:
        config = DaemonConfig(
            daemon=shape.daemon,
            metrics=shape.metrics,
            output=shape.output,
            datasets=datasets,
            sources=sources,
            encoders=encoders,
            path=path,
        )
    except ValidationError as e:  # pragma: no cover - the parts were validated above
        raise ConfigError(_messages(e)) from e
    if overlaps := check_paths(config):
        raise ConfigError(overlaps)
    return config


def _fed(source: SourceConfig) -> list[str]:
    """The datasets a source's events may go to."""
    if source.route is not None:
        names = [*source.route.to.values()]
        if source.route.default is not None:
            names.append(source.route.default)
        return list(dict.fromkeys(names))
    return [source.dataset] if source.dataset is not None else []


def _datasets(
    shape: _Shape,
    sources: list[SourceConfig],
    raw_encoders: dict[str, Any],
    errors: list[str],
) -> dict[str, DatasetSection]:
    """The config's datasets (one, named after the encoder, in the older form), with every
    reference between sources, datasets and encoders checked into ``errors``."""
    if shape.output is not None and shape.datasets:
        errors.append(
            "output: a config has either [output] (one dataset, `encoder` on each source) or "
            "[datasets.NAME] tables, not both: move [output]'s keys into each dataset"
        )
        return {}
    if shape.output is not None:
        return _legacy_datasets(shape.output, sources, raw_encoders, errors)
    if not shape.datasets:
        errors.append("datasets: no [datasets.NAME] table (or [output]): shards go nowhere")
        return {}
    errors.extend(_url_overlaps(shape.datasets))
    for name, dataset in shape.datasets.items():
        if not re.match(NAME_PATTERN, name):
            errors.append(f"datasets.{name}: a dataset name is letters, digits, _, . and -")
        if dataset.encoder not in raw_encoders:
            errors.append(f"datasets.{name}.encoder: no [encoders.{dataset.encoder}] table")
            continue
        errors.extend(_partition_errors(name, dataset, raw_encoders[dataset.encoder]))
    for i, source in enumerate(sources):
        where = f" [source {source.name!r}]"
        if source.encoder is not None:
            errors.append(
                f"sources[{i}].encoder: with [datasets], a source names its dataset "
                f'(`dataset = "NAME"`, whose `encoder` is the schema), not an encoder{where}'
            )
        if (source.dataset is None) == (source.route is None):
            errors.append(
                f'sources[{i}]: set either `dataset = "NAME"` or a [sources.route] table{where}'
            )
            continue
        key = "dataset" if source.route is None else "route"
        for name in _fed(source):
            if name not in shape.datasets:
                errors.append(f"sources[{i}].{key}: no [datasets.{name}] table{where}")
    return dict(shape.datasets)


def _url_overlaps(datasets: dict[str, DatasetSection]) -> list[str]:
    """Datasets whose object-store ``dir`` is another's, or inside it: one would list, mark
    and read the other's shards (local directories are checked with the other paths)."""
    urls = {n: d.dir.rstrip("/") for n, d in datasets.items() if is_url(d.dir)}
    out = []
    for a, b in itertools.combinations(urls, 2):
        ua, ub = urls[a], urls[b]
        if ua == ub:
            out.append(f"datasets.{b}.dir: is the same location as datasets.{a}.dir ({ua})")
        elif ub.startswith(ua + "/") or ua.startswith(ub + "/"):
            inner, outer = (b, a) if ub.startswith(ua + "/") else (a, b)
            out.append(
                f"datasets.{inner}.dir: is inside datasets.{outer}.dir ({urls[outer]}): the "
                "outer dataset's listings would take the inner one's shards"
            )
    return out


def _legacy_datasets(
    output: OutputSection,
    sources: list[SourceConfig],
    raw_encoders: dict[str, Any],
    errors: list[str],
) -> dict[str, DatasetSection]:
    named: dict[str, list[str]] = {}
    for i, source in enumerate(sources):
        where = f" [source {source.name!r}]"
        if source.dataset is not None or source.route is not None:
            key = "dataset" if source.dataset is not None else "route"
            errors.append(
                f"sources[{i}].{key}: datasets are declared as [datasets.NAME] tables, "
                f"with no [output]{where}"
            )
        elif source.encoder is None:
            errors.append(f"sources[{i}].encoder: missing (or use [datasets]){where}")
        elif source.encoder not in raw_encoders:
            errors.append(f"sources[{i}].encoder: no [encoders.{source.encoder}] table{where}")
        else:
            named.setdefault(source.encoder, []).append(source.name)
    if len(named) > 1:
        uses = "; ".join(f"{e!r} by {', '.join(map(repr, s))}" for e, s in sorted(named.items()))
        errors.append(
            f"sources: one [output] would mix the records of several encoders in its shards "
            f"({uses}): declare a [datasets.NAME] table for each (`encoder`, `dir`, ...) and "
            'give each source `dataset = "NAME"`'
        )
        return {}
    return {e: legacy_dataset(output, e) for e in named}


def _partition_errors(name: str, dataset: DatasetSection, raw_encoder: Any) -> list[str]:
    """``partition.time_field`` and ``partition.fields`` checked against the schema."""
    part = dataset.partition
    wanted = [f for f in [part.time_field, *part.fields] if f]
    if not wanted:
        return []
    features = raw_encoder.get("features") if isinstance(raw_encoder, dict) else None
    if not isinstance(features, dict):
        features = (raw_encoder or {}).get("context") if isinstance(raw_encoder, dict) else None
    if not isinstance(features, dict):
        return [
            f"datasets.{name}.partition: encoder {dataset.encoder!r} declares no features to "
            "read partition values from"
        ]
    out = []
    for field in wanted:
        if field not in features:
            out.append(
                f"datasets.{name}.partition: {field!r} is not a feature of encoder "
                f"{dataset.encoder!r}"
            )
            continue
        spec = features[field]
        options = spec if isinstance(spec, dict) else {}
        kind = spec if isinstance(spec, str) else options.get("type")
        timed = kind == "bytes" or (kind == "int64" and options.get("time_unit"))
        if field == part.time_field and not timed:
            out.append(
                f"datasets.{name}.partition.time_field: {field!r} must be an int64 "
                "feature with time_unit, or a bytes feature of RFC 3339 text"
            )
    return out


MAX_PARSEABLE_RECORD_BYTES = (1 << 31) - 1
"""Protobuf parses no message of 2 GiB or more: nor do ``tf.io.parse_example`` and the tools."""

_WHOLE_EVENT_ENCODERS = ("passthrough", "image")
"""Encoders that write each event's bytes whole into its record."""


def _record_limit_errors(
    i: int, source: SourceConfig, encoder: Any, dataset: DatasetSection | None, where: str
) -> list[str]:
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
                f"{dataset.encoder if dataset else source.encoder!r} (type {encoder['type']!r}) "
                "writes each event whole into one record, and neither TensorFlow nor protobuf "
                "parses a record of 2 GiB or more"
                f"{where}"
            )
    return out


def load_config(path: str | os.PathLike[str], registry: Registry | None = None) -> DaemonConfig:
    """Read and validate a TOML config file, its string values' ``${…}`` references substituted
    (:mod:`tfrecordd.interpolate`); raises :class:`ConfigError` on any problem."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigFileError(str(p), f"cannot read the config file: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{p}: not valid TOML: {e}"]) from e
    return parse_config(interpolate(data), registry or Registry.from_entry_points(), p)
