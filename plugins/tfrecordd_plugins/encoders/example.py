"""``type = "example"``: JSON events and CSV rows to ``tf.train.Example`` through a schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import orjson
import pydantic

from tfrecordd.plugin import (
    EncodeError,
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
    not_json,
)
from tfrecordd.schema import ExampleSchema, FeatureSpec, compile_json_plan


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

    def declared_schema(self) -> ExampleSchema:
        """The schema of :attr:`features`, which ``tfrecordd schema`` describes."""
        return ExampleSchema(self.features)


class ExampleEncoder(Encoder):
    """Parses each event as JSON (unless the source already structured it), or converts a CSV
    row's text fields, and encodes it.

    Where it can, the compiled plan parses the JSON payloads and writes the records in one call
    per batch; an event it is not certain of (malformed, a value to convert or refuse, anything
    unusual) takes the Python path, which writes the same bytes or reports the failure.
    """

    parses_json = True

    def __init__(self, config: ExampleEncoderConfig) -> None:
        self.schema = ExampleSchema(config.features)
        self.plan = compile_json_plan(self.schema)
        """The compiled JSON path, or ``None`` where the Python path does all the work."""

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        fast: list[bytes | None] | None = None
        if self.plan is not None:
            # b"" is never a record: events that are not JSON payloads come back as None.
            fast = self._fast(
                [ev.payload if ev.format is None and ev.value is None else b"" for ev in events]
            )
        return self._finish(events, fast)

    def encode_lines(self, payloads: list[bytes]) -> EncodeResult:
        if self.plan is None:
            return super().encode_lines(payloads)
        fast = self._fast(payloads)
        # Events are made only for the Python path to name failures by: when one is needed.
        events = [] if None not in fast else [RawEvent(p, "") for p in payloads]
        return self._finish(events, fast)

    def _fast(self, payloads: list[bytes]) -> list[bytes | None]:
        """The compiled plan's answers; all ``None`` (the Python path) if it cannot allocate."""
        assert self.plan is not None
        try:
            return self.plan.encode_batch(payloads)
        except MemoryError:
            return [None] * len(payloads)

    def _finish(self, events: Sequence[RawEvent], fast: list[bytes | None] | None) -> EncodeResult:
        """The records: the compiled plan's where it gave one, the Python path's elsewhere."""
        result = EncodeResult()
        records, failures = result.records, result.failures
        if fast is not None and None not in fast:
            records.extend(cast("list[bytes]", fast))
            return result
        encode_json, encode_csv = self.schema.encode_json, self.schema.encode_csv
        for i, ev in enumerate(events):
            if fast is not None and (record := fast[i]) is not None:
                records.append(record)
                continue
            fmt = ev.format
            try:
                if fmt is None:
                    records.append(encode_json(ev.payload, ev.value))
                elif fmt == "csv":
                    records.append(encode_csv(ev.value))
                else:
                    failures.append(
                        Failure(
                            i, FailureReason.FORMAT, f"cannot encode {fmt!r} events as an Example"
                        )
                    )
            except orjson.JSONDecodeError as e:
                failures.append(Failure(i, FailureReason.MALFORMED, not_json(e)))
            except EncodeError as e:
                failures.append(Failure(i, FailureReason.SCHEMA, str(e)))
        return result
