"""``type = "passthrough"``: events that already are serialized Examples or SequenceExamples.

Each payload is checked, then written as it came, byte for byte. The check parses it with
protobuf's C parser (upb) into :mod:`tfrecordd.proto`'s classes: bytes that do not parse are
refused, and so, by default, are bytes that parse but carry fields the message does not declare.
Protobuf keeps such unknown fields silently, so a payload of some other message type, or a
corrupted one, often parses; the check finds them by comparing the parsed message's size before
and after ``DiscardUnknownFields()``, which counts unknown fields at every depth.

That check costs about three microseconds for a 300-byte Example (a hand-written walk of the wire
format in Python costs three times as much, so it is not used); a plain parse about one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from google.protobuf.message import DecodeError

from tfrecordd import proto
from tfrecordd.errors import TfrecorddError
from tfrecordd.plugin import Encoder, EncoderConfig, EncodeResult, RawEvent


class PassthroughEncoderConfig(EncoderConfig):
    """Records that arrive already serialized, validated and written unchanged."""

    type: Literal["passthrough"] = "passthrough"
    message: Literal["example", "sequence"] = "example"
    """What each payload must be: a ``tf.train.Example`` or a ``tf.train.SequenceExample``."""
    unknown_fields: Literal["reject", "keep"] = "reject"
    """``reject``: a payload that parses but holds fields its message does not declare (another
    message type, damage) is a dead letter. ``keep``: only bytes that do not parse at all are
    refused; about three times faster."""

    def build(self) -> PassthroughEncoder:
        return PassthroughEncoder(self)

    def feature_description(self) -> dict[str, Any]:
        """Never available: the features are whatever the producers put in the records."""
        raise TfrecorddError(
            "a passthrough encoder writes the records it is given unchanged; their features are "
            "whatever the producers put in them, so the config cannot describe them"
        )


class PassthroughEncoder(Encoder):
    """Parses each payload to validate it; writes the payload itself."""

    def __init__(self, config: PassthroughEncoderConfig) -> None:
        self._cls = proto.Example if config.message == "example" else proto.SequenceExample
        self._what = "an Example" if config.message == "example" else "a SequenceExample"
        self._strict = config.unknown_fields == "reject"

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        result = EncodeResult()
        records, failures = result.records, result.failures
        msg: Any = self._cls()
        strict = self._strict
        for i, ev in enumerate(events):
            data = ev.payload
            try:
                msg.ParseFromString(data)
            except DecodeError as e:
                failures.append((i, "malformed", f"not {self._what}: {e}"))
                continue
            if strict:
                size = msg.ByteSize()
                msg.DiscardUnknownFields()
                if msg.ByteSize() != size:
                    failures.append(
                        (
                            i,
                            "malformed",
                            f"not {self._what}: it parses, but holds fields that message "
                            "does not have (another message type, or damaged bytes)",
                        )
                    )
                    continue
            records.append(data if data.__class__ is bytes else bytes(data))
        return result
