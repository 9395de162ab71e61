"""``type = "passthrough"``: events that already are serialized Examples or SequenceExamples.

Each payload is checked, then written as it came, byte for byte. An Example must be one that
``tf.io.parse_example`` reads, and reads as protobuf does (:mod:`tfrecordd.format.tfreading`):
TensorFlow's own parser refuses some records protobuf accepts (a map entry without its key or
value, a group, a field beside the entries of ``Features``), and reads others differently or as
garbage (a packed float list whose length is not a multiple of 4, a ``Feature`` with two kinds,
a repeated key): all of these are dead letters, with the reason. By default, so is a payload
that holds fields the message does not declare (another message type, or damage, often parses)
or a key that is not UTF-8; ``unknown_fields = "keep"`` accepts both, as TensorFlow does. A
SequenceExample is checked by protobuf's C parser (upb): bytes that do not parse are refused,
and by default so are unknown fields, found by comparing the parsed message's size before and
after ``DiscardUnknownFields()``.

Where the compiled checks are built (:mod:`tfrecordd.format.compiled`), a walk of the wire format in
C goes over the batch first: it certifies each payload that is valid in every sense above with no
unknown field at any depth (about 0.07 µs for a 210-byte Example), and flags every one it cannot
vouch for (whatever is unusual, not only what is invalid). Only the flagged payloads are judged as
above (a few µs each), so a batch of ordinary Examples costs about 0.1 µs per record in either mode,
against about 0.8 for TensorFlow's ``TFRecordWriter.write`` of the same bytes (which checks
nothing)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from google.protobuf.message import DecodeError

from tfrecordd.format import compiled, proto, tfreading
from tfrecordd.plugin import (
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
    TfrecorddError,
)


class PassthroughEncoderConfig(EncoderConfig):
    """Records that arrive already serialized, validated and written unchanged."""

    type: Literal["passthrough"] = "passthrough"
    message: Literal["example", "sequence"] = "example"
    """What each payload must be: a ``tf.train.Example`` or a ``tf.train.SequenceExample``."""
    unknown_fields: Literal["reject", "keep"] = "reject"
    """``reject``: a payload that parses but holds fields its message does not declare (another
    message type, damage), or an Example key that is not UTF-8, is a dead letter. ``keep``: both
    are accepted, as ``tf.io.parse_example`` reads them; what TensorFlow refuses or reads
    differently from protobuf is refused either way (docs/encoders.md). With the compiled check
    (``tfrecordd.format.compiled``) ordinary payloads cost the same either way."""

    def build(self) -> PassthroughEncoder:
        return PassthroughEncoder(self)

    def feature_description(self) -> dict[str, Any]:
        """Never available: the features are whatever the producers put in the records."""
        raise TfrecorddError(
            "a passthrough encoder writes the records it is given unchanged; their features are "
            "whatever the producers put in them, so the config cannot describe them"
        )


class PassthroughEncoder(Encoder):
    """Parses each payload to validate it (after the C check, only those it cannot vouch for);
    writes the payload itself."""

    def __init__(self, config: PassthroughEncoderConfig) -> None:
        self._cls = proto.Example if config.message == "example" else proto.SequenceExample
        self._what = "an Example" if config.message == "example" else "a SequenceExample"
        self._sequence = config.message == "sequence"
        self._strict = config.unknown_fields == "reject"

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        payloads = [ev.payload for ev in events]
        # Indices of the payloads protobuf must judge, ascending; every other one is certified
        # valid (and is an exact bytes object).
        flagged: Iterable[int]
        flagged = compiled.check_messages(payloads, self._sequence)
        if not flagged:
            return EncodeResult(records=payloads)
        result = EncodeResult()
        records, failures = result.records, result.failures
        msg: Any = self._cls()
        start = 0
        for i in flagged:
            if start < i:
                records += payloads[start:i]
            start = i + 1
            data = payloads[i]
            refusal = self._refusal(msg, data)
            if refusal is None:
                records.append(data if data.__class__ is bytes else bytes(data))
            else:
                failures.append(Failure(i, FailureReason.MALFORMED, refusal))
        records += payloads[start:]
        return result

    def _refusal(self, msg: Any, data: bytes) -> str | None:
        """Why ``data`` is refused, or ``None`` if it is not: for an Example, by
        :func:`tfrecordd.format.tfreading.refusal`; then by protobuf (parsed into ``msg``), except
        an Example in ``keep`` mode (protobuf's ``string`` would refuse a key TensorFlow reads)."""
        if not self._sequence:
            refusal = tfreading.refusal(data, self._strict)
            if refusal is not None or not self._strict:
                return refusal
        try:
            msg.ParseFromString(data)
        except DecodeError as e:
            return f"not {self._what}: {e}"
        if self._strict:
            size = msg.ByteSize()
            msg.DiscardUnknownFields()
            if msg.ByteSize() != size:
                return (
                    f"not {self._what}: it parses, but holds fields that message "
                    "does not have (another message type, or damaged bytes)"
                )
        return None
