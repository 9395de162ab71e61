"""``type = "example"``: JSON events to ``tf.train.Example`` through a declared schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson

from tfrecordd.errors import EncodeError
from tfrecordd.plugin import Encoder, EncoderConfig, EncodeResult, RawEvent
from tfrecordd.schema import ExampleSchema, FeatureSpec


class ExampleEncoderConfig(EncoderConfig):
    """An Example per event: each feature from the event's JSON by name or ``path``."""

    type: Literal["example"] = "example"
    features: dict[str, FeatureSpec]
    """Feature name → type (``"int64"``, ``"float"``, ``"bytes"``) or a table of feature options
    (``type``, ``path``, ``required``, ``default``, ``shape``, ``time_unit``)."""

    def build(self) -> ExampleEncoder:
        return ExampleEncoder(self)


class ExampleEncoder(Encoder):
    """Parses each event as JSON (unless the source already structured it) and encodes it."""

    def __init__(self, config: ExampleEncoderConfig) -> None:
        self.schema = ExampleSchema(config.features)

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        records, failures = result.records, result.failures
        encode, loads = self.schema.encode, orjson.loads
        for i, ev in enumerate(events):
            try:
                value = ev.value if ev.value is not None else loads(ev.payload)
            except orjson.JSONDecodeError as e:
                failures.append((i, "malformed", f"not valid JSON: {e}"))
                continue
            try:
                records.append(encode(value))
            except EncodeError as e:
                failures.append((i, "schema", str(e)))
        return result
