"""``type = "example"``: JSON events and CSV rows to ``tf.train.Example`` through a schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson
import pydantic

from tfrecordd.errors import EncodeError
from tfrecordd.plugin import Encoder, EncoderConfig, EncodeResult, RawEvent
from tfrecordd.schema import ExampleSchema, FeatureSpec, feature_description


class ExampleEncoderConfig(EncoderConfig):
    """An Example per event: each feature from the event's JSON by name or ``path``, or from a CSV
    row's column of that header name."""

    type: Literal["example"] = "example"
    features: dict[str, FeatureSpec] = pydantic.Field(min_length=1)
    """Feature name → type (``"int64"``, ``"float"``, ``"bytes"``) or a table of feature options
    (``type``, ``path``, ``required``, ``default``, ``shape``, ``time_unit``, ``length``,
    ``separator``). For CSV rows, ``path`` is the column's header name."""

    def build(self) -> ExampleEncoder:
        return ExampleEncoder(self)

    def feature_description(self) -> dict[str, Any]:
        """The ``tf.io.parse_example`` features that read what this encoder writes."""
        return feature_description(ExampleSchema(self.features))


class ExampleEncoder(Encoder):
    """Parses each event as JSON (unless the source already structured it), or converts a CSV
    row's text fields, and encodes it."""

    def __init__(self, config: ExampleEncoderConfig) -> None:
        self.schema = ExampleSchema(config.features)

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        records, failures = result.records, result.failures
        encode, encode_csv, loads = self.schema.encode, self.schema.encode_csv, orjson.loads
        for i, ev in enumerate(events):
            fmt = ev.format
            try:
                if fmt is None:
                    value = ev.value if ev.value is not None else loads(ev.payload)
                    records.append(encode(value))
                elif fmt == "csv":
                    records.append(encode_csv(ev.value))
                else:
                    failures.append((i, "format", f"cannot encode {fmt!r} events as an Example"))
            except orjson.JSONDecodeError as e:
                failures.append((i, "malformed", f"not valid JSON: {e}"))
            except EncodeError as e:
                failures.append((i, "schema", str(e)))
        return result
