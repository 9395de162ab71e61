"""JSON numbers beyond a double's range (``1e400``, an integer of 310 digits): JSON allows them
and orjson refuses them. An event holding one where no feature reads it is encoded as if the
field were absent; a feature that reads one refuses the event as out of range, not as JSON."""

from __future__ import annotations

from typing import Any

import pytest

from tfrecordd.plugin import RawEvent
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.encoders.sequence import SequenceEncoderConfig

FEATURES = {"id": "int64", "x": "float", "s": "bytes", "t": {"type": "int64", "time_unit": "ms"}}
WIDE = ["1e400", "-1e400", "1.5E+999", "9" * 310, "-" + "9" * 310, "1" + "0" * 5000]


def _example() -> Any:
    return ExampleEncoderConfig.model_validate({"features": FEATURES}).build()


def _both(encoder: Any, payload: bytes) -> tuple[list[bytes], list[tuple[str, str]]]:
    """The encoder's answer for one payload by both of its ways in (the compiled plan's batch
    of lines and the events' path): the same, whichever way."""
    by_lines = encoder.encode_lines([payload])
    by_events = encoder.encode_batch([RawEvent(payload, "w")])
    answers = [
        (r.records, [(str(f.reason), f.detail) for f in r.failures]) for r in (by_lines, by_events)
    ]
    assert answers[0] == answers[1]
    return answers[0]


@pytest.mark.parametrize("number", WIDE)
@pytest.mark.parametrize("where", ["{n}", "[1, {n}]", '{{"deep": [{{"k": {n}}}]}}'])
def test_a_wide_number_no_feature_reads_is_ignored(number: str, where: str) -> None:
    encoder = _example()
    unused = where.format(n=number)
    payload = f'{{"id": 7, "x": 2.5, "s": "é", "t": 1.5, "junk": {unused}}}'.encode()
    expected, _ = _both(encoder, b'{"id": 7, "x": 2.5, "s": "\xc3\xa9", "t": 1.5}')
    assert _both(encoder, payload) == (expected, [])


@pytest.mark.parametrize(
    ("feature", "number", "reason"),
    [
        ("id", "1e400", "feature 'id': int64 out of range: 1e400"),
        ("id", "9" * 310, "feature 'id': int64 out of range: " + "9" * 37 + "..."),
        ("x", "1e400", "feature 'x': float out of float32 range: 1e400"),
        ("x", "-" + "9" * 310, "feature 'x': float out of float32 range: -" + "9" * 36 + "..."),
        ("s", "1e400", "feature 's': expected bytes, got number 1e400"),
        ("t", "1e400", "feature 't': int64 out of range: 1e400"),
        ("x", "[1, 1e400]", "feature 'x': float out of float32 range: 1e400"),
    ],
)
def test_a_wide_number_a_feature_reads_is_out_of_range(
    feature: str, number: str, reason: str
) -> None:
    records, failures = _both(_example(), f'{{"id": 1, "{feature}": {number}}}'.encode())
    assert (records, failures) == ([], [("schema", reason)])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"id": 1, "junk": NaN}', None),  # Python's json writes these; JSON has no such values
        (b'{"id": 1, "junk": Infinity, "w": 1e400}', None),
        (b'{"id": 1, "junk": 1e400', "Expecting ',' delimiter"),
        (b'{"id": 1, "junk": 1e400, "s": "\\ud800"}', "an escaped lone surrogate"),
        (b'{"id": 1, "s": "\\ud800"}', None),
        (b'{"id": 1, "junk": 1e400}\xff', None),
    ],
)
def test_what_is_not_json_stays_refused_as_json(payload: bytes, reason: str | None) -> None:
    records, failures = _both(_example(), payload)
    assert records == []
    [(kind, detail)] = failures
    assert kind == "malformed"
    assert detail.startswith("not valid JSON")
    if reason is not None:
        assert reason in detail


def test_sequence_events_take_wide_numbers_too() -> None:
    encoder = SequenceEncoderConfig.model_validate(
        {"context": {"id": "int64"}, "feature_lists": {"v": "float"}, "steps": "steps"}
    ).build()
    ok = encoder.encode_batch(
        [RawEvent(b'{"id": 1, "junk": 1e400, "steps": [{"v": 1.5, "w": 1e999}]}', "w")]
    )
    plain = encoder.encode_batch([RawEvent(b'{"id": 1, "steps": [{"v": 1.5}]}', "w")])
    assert ok.records == plain.records
    assert not ok.failures
    bad = encoder.encode_batch([RawEvent(b'{"id": 1, "steps": [{"v": 1e400}]}', "w")])
    [(_, kind, detail)] = bad.failures
    assert str(kind) == "schema"
    assert "out of float32 range: 1e400" in detail


def test_a_redis_entry_with_a_wide_number_keeps_its_id_field() -> None:
    """Redis Streams with ``id_field``: an entry whose JSON holds ``1e400`` in a field no feature
    reads gets its entry ID like any other (it was left without it, and encoded with the
    ID feature missing)."""
    from tfrecordd_plugins.sources.redis_stream.config import RedisStreamSourceConfig
    from tfrecordd_plugins.sources.redis_stream.scripts import Entry

    source = RedisStreamSourceConfig(name="r", encoder="e", stream="s", id_field="eid").build()
    payload = b'{"id": 1, "n": 1e400}'
    event = source.guarded_event(Entry("5-1", 0, payload, len(payload), [], False))
    assert event is not None
    assert event.error is None
    assert event.value is not None
    assert event.value["eid"] == "5-1"
    encoder = ExampleEncoderConfig.model_validate(
        {"features": {"id": "int64", "eid": "bytes"}}
    ).build()
    result = encoder.encode_batch([event])
    assert not result.failures
    assert len(result.records) == 1
