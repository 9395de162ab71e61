"""``type = "sequence"``: JSON events to ``tf.train.SequenceExample`` through a declared schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson
import pydantic

from tfrecordd.plugin import (
    ConfigError,
    EncodeError,
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
    not_json,
)
from tfrecordd.schema import FeatureSpec, SequenceSchema


class SequenceEncoderConfig(EncoderConfig):
    """A SequenceExample per JSON event: per-sequence ``context`` features and per-step
    ``feature_lists``, with the steps either parallel arrays or an array of ``steps`` objects."""

    type: Literal["sequence"] = "sequence"
    context: dict[str, FeatureSpec] = pydantic.Field(default_factory=dict)
    """Per-sequence features, declared like an Example's; a sequence length is an ``int64``
    feature with ``length = true`` whose ``path`` is the steps array."""
    feature_lists: dict[str, FeatureSpec] = pydantic.Field(min_length=1)
    """Per-step features: the spec describes one step's value. Without ``steps``, ``path`` names
    an array with one value per step (all such arrays must have the same length); with ``steps``,
    ``path`` is relative to each step object. A step lacking a value gets ``default``, is refused
    if ``required``, and is otherwise written as an empty value list, so steps stay aligned."""
    steps: str | None = None
    """Path to an array of step objects, such as ``tokens`` for events holding
    ``"tokens": [{"text": "Ada", "tag": 1}, ...]``. Default: the feature lists are parallel
    arrays."""

    @pydantic.model_validator(mode="after")
    def _compiles(self) -> SequenceEncoderConfig:
        try:
            self.compiled()
        except ConfigError as e:
            raise ValueError("; ".join(e.errors)) from None
        return self

    def compiled(self) -> SequenceSchema:
        """The compiled schema this config describes."""
        return SequenceSchema(self.context, self.feature_lists, self.steps)

    def build(self) -> SequenceEncoder:
        return SequenceEncoder(self)

    def declared_schema(self) -> SequenceSchema:
        """The compiled schema, which ``tfrecordd schema`` describes."""
        return self.compiled()


class SequenceEncoder(Encoder):
    """Parses each event as JSON (unless the source already structured it) and encodes it."""

    parses_json = True

    def __init__(self, config: SequenceEncoderConfig) -> None:
        self.schema = config.compiled()

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        records, failures = result.records, result.failures
        encode_json = self.schema.encode_json
        for i, ev in enumerate(events):
            if ev.format is not None:
                failures.append(
                    Failure(
                        i,
                        FailureReason.FORMAT,
                        f"cannot encode {ev.format!r} events as a SequenceExample",
                    )
                )
                continue
            try:
                records.append(encode_json(ev.payload, ev.value))
            except orjson.JSONDecodeError as e:
                failures.append(Failure(i, FailureReason.MALFORMED, not_json(e)))
            except EncodeError as e:
                failures.append(Failure(i, FailureReason.SCHEMA, str(e)))
        return result
