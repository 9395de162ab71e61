"""What the encode stage builds of a config, and which of it each source's batches go through
(:func:`plan_encoding`): a plain encoder for a source feeding one dataset without partitions, a
:class:`~tfrecordd.pipeline.routing.TargetConfig` for a routed or partitioned one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tfrecordd.config import DaemonConfig
from tfrecordd.format.compression import Compression
from tfrecordd.pipeline.routing import DatasetPlan, TargetConfig
from tfrecordd.plugin import EncoderConfig
from tfrecordd.schema import FeatureSpec

__all__ = ["EncodePlan", "SourcePlan", "plan_encoding"]


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """How one source's batches are encoded."""

    target: str
    """The name of what encodes them (a key of :attr:`EncodePlan.builders`)."""
    dataset: str | None
    """The dataset of all its records, when one encoder makes them and they go to no partition
    (the encoder's records become one part); ``None`` when a :class:`Target` gives parts."""
    compression: Compression
    level: int | None


@dataclass(frozen=True, slots=True)
class EncodePlan:
    """What the encode stage builds, and which of it each source's batches go through."""

    builders: dict[str, EncoderConfig | TargetConfig]
    """Encoders (by their config's name) and targets (``@<source>``), built once per process."""
    sources: dict[str, SourcePlan]


def plan_encoding(config: DaemonConfig) -> EncodePlan:
    """The encode plan of a config: a plain encoder for each source feeding one dataset without
    partitions, a :class:`TargetConfig` for any other."""
    builders: dict[str, EncoderConfig | TargetConfig] = {}
    sources: dict[str, SourcePlan] = {}

    def dataset_plan(name: str) -> DatasetPlan:
        d = config.datasets[name]
        encoder = config.encoders[d.encoder]
        schema = encoder.declared_schema()
        features: Mapping[str, FeatureSpec] = {}
        if schema is not None:
            features = getattr(schema, "features", None) or getattr(schema, "context", {})
        return DatasetPlan(
            encoder,
            d.compression,
            d.level,
            d.partition,
            dict(features),
            d.max_shard_records,
            d.max_shard_bytes,
        )

    for source in config.sources:
        fed = config.fed_datasets(source)
        first = config.datasets[fed[0]]
        if source.route is None and not first.partition.partitioned:
            builders[first.encoder] = config.encoders[first.encoder]
            sources[source.name] = SourcePlan(first.encoder, fed[0], first.compression, first.level)
            continue
        name = f"@{source.name}"
        builders[name] = TargetConfig(
            {n: dataset_plan(n) for n in fed},
            dataset=fed[0] if source.route is None else None,
            route=source.route,
        )
        sources[source.name] = SourcePlan(name, None, first.compression, first.level)
    return EncodePlan(builders, sources)
