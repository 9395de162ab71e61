"""Every built-in encoder against :func:`tfrecordd.testing.check_encoder`, and the checker
against encoders that break the contract in each way it names."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import pytest
from PIL import Image

from tests.support import MOVIES_FEATURES, movie_event
from tfrecordd.format.proto import Example
from tfrecordd.plugin import (
    Encoder,
    EncoderConfig,
    EncodeResult,
    Failure,
    FailureReason,
    RawEvent,
    Registry,
)
from tfrecordd.testing import ContractError, check_encoder


def _json(value: Any) -> RawEvent:
    return RawEvent(json.dumps(value).encode(), "contract")


def _image(fmt: str, folder: str = "cats") -> RawEvent:
    buffer = io.BytesIO()
    Image.new("RGB", (5, 3)).save(buffer, format=fmt)
    value = {"filename": f"x.{fmt.lower()}", "label": folder, "path": f"{folder}/x"}
    return RawEvent(buffer.getvalue(), "contract", value=value, format="file")


def _example(i: int) -> bytes:
    msg = Example()
    msg.features.feature["id"].int64_list.value.append(i)
    return bytes(msg.SerializeToString())


CASES: dict[str, tuple[dict[str, Any], list[RawEvent], list[RawEvent]]] = {
    "example": (
        {"features": MOVIES_FEATURES},
        [_json(movie_event(i)) for i in range(6)],
        [RawEvent(b"{not json", "x"), _json({"id": "seven"}), _json([1, 2])],
    ),
    "sequence": (
        {"context": {"id": "int64"}, "feature_lists": {"tokens": "int64"}, "steps": "steps"},
        [_json({"id": i, "steps": [{"tokens": [i, i + 1]}]}) for i in range(4)],
        [RawEvent(b"\xff", "x"), _json({"id": 1, "steps": [{"tokens": ["a"]}]})],
    ),
    "image": (
        {"labels": {"cats": 0, "dogs": 1}},
        [_image("PNG"), _image("JPEG", "dogs")],
        [
            RawEvent(b"not an image", "x", value={"filename": "y", "label": "cats"}, format="file"),
            _image("PNG", "birds"),
            _json({"id": 1}),
        ],
    ),
    "passthrough": (
        {},
        [RawEvent(_example(i), "x") for i in range(5)],
        [RawEvent(b"\x0a\x05\x0a\x03", "x")],
    ),
}


def _config(kind: str, options: dict[str, Any]) -> EncoderConfig:
    model = Registry.from_entry_points().encoders[kind]
    return model.model_validate({"type": kind, **options})


def test_every_registered_encoder_has_a_case() -> None:
    assert set(Registry.from_entry_points().encoders) == set(CASES)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_built_in_encoder_keeps_the_contract(kind: str) -> None:
    options, good, bad = CASES[kind]
    records = check_encoder(_config(kind, options), good, bad)
    assert len(records) == len(good)


class _Broken(Encoder):
    def __init__(self, how: str) -> None:
        self.how = how
        self.calls = 0

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        self.calls += 1
        result = EncodeResult()
        for i, ev in enumerate(events):
            if ev.payload == b"bad":
                reason: Any = "oops" if self.how == "reason" else FailureReason.SCHEMA
                result.failures.append(Failure(i, reason, "bad"))
                if self.how == "twice":
                    result.failures.append(Failure(i, FailureReason.SCHEMA, "bad"))
            elif self.how == "context":
                result.records.append(ev.payload + str(len(events)).encode())
            elif self.how == "lost" and i == 0:
                continue
            else:
                result.records.append(ev.payload)
        return result

    def encode_lines(self, payloads: list[bytes]) -> EncodeResult:
        if self.how == "lines":
            return EncodeResult(records=[b"x" for _ in payloads])
        return super().encode_lines(payloads)


class BrokenConfig(EncoderConfig):
    """An encoder config whose encoder breaks the contract as ``how`` says."""

    type: str = "broken"
    how: str = ""

    def build(self) -> Encoder:
        return _Broken(self.how)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("reason", "unknown failure reason"),
        ("twice", "out of range or repeated"),
        ("lost", "records and"),
        ("context", "alone than in a batch"),
        ("lines", "disagree"),
    ],
)
def test_the_checker_catches_each_broken_rule(how: str, message: str) -> None:
    good = [RawEvent(b'{"a": 1}', "x"), RawEvent(b'{"a": 2}', "x")]
    with pytest.raises(ContractError, match=message):
        check_encoder(BrokenConfig(how=how), good, [RawEvent(b"bad", "x")])
    check_encoder(BrokenConfig(), good, [RawEvent(b"bad", "x")])


def test_the_checker_catches_a_good_event_refused_and_a_bad_one_encoded() -> None:
    with pytest.raises(ContractError, match="the good event"):
        check_encoder(BrokenConfig(), [RawEvent(b"bad", "x")])
    with pytest.raises(ContractError, match="the bad event"):
        check_encoder(BrokenConfig(), [], [RawEvent(b"fine", "x")])
