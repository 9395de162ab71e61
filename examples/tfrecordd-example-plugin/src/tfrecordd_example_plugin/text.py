"""``type = "example-text"``: each event's bytes, as UTF-8 text, in a ``tf.train.Example``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from tfrecordd.format.wire import ExampleWriter, FeatureType
from tfrecordd.plugin import (
    EncodeError,
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
)


class TextEncoderConfig(EncoderConfig):
    """Writes ``text`` (the event, bytes) and ``length`` (its length in bytes, int64)."""

    type: Literal["example-text"] = "example-text"
    strip: bool = True
    """Leave out leading and trailing whitespace."""

    def build(self) -> TextEncoder:
        return TextEncoder(self)

    def feature_description(self) -> dict[str, Any]:
        return {
            "text": {"kind": "FixedLenFeature", "shape": [], "dtype": "string"},
            "length": {"kind": "FixedLenFeature", "shape": [], "dtype": "int64"},
        }


class TextEncoder(Encoder):
    def __init__(self, config: TextEncoderConfig) -> None:
        self.strip = config.strip
        self.writer = ExampleWriter([("text", FeatureType.BYTES), ("length", FeatureType.INT64)])

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        for i, event in enumerate(events):
            text = event.payload.strip() if self.strip else event.payload
            if not text:
                result.failures.append(Failure(i, FailureReason.MALFORMED, "an empty event"))
                continue
            try:
                text.decode()
                record = self.writer.encode([[text], [len(text)]])
            except UnicodeDecodeError as e:
                result.failures.append(Failure(i, FailureReason.MALFORMED, f"not UTF-8: {e}"))
            except EncodeError as e:
                result.failures.append(Failure(i, FailureReason.SCHEMA, str(e)))
            else:
                result.records.append(record)
        return result
