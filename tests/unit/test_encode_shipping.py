"""What travels to an encode worker and back: events shipped as one payload, lines left unsplit,
records packed."""

from __future__ import annotations

import io
import pickle

from tfrecordd.format.compression import Compression
from tfrecordd.format.decompress import open_decompressed
from tfrecordd.format.framing import frame_many
from tfrecordd.format.writer import Packed
from tfrecordd.pipeline.encoding import PACK_MIN_BYTES, EncodeRequest, encode
from tfrecordd.plugin import Lines, RawBatch, RawEvent
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

CONFIG = ExampleEncoderConfig.model_validate({"features": {"id": "int64", "name": "bytes"}})
ENCODER = CONFIG.build()


def _events(n: int) -> list[RawEvent]:
    events = []
    for i in range(n):
        if i % 7 == 3:
            events.append(
                RawEvent(b"", f"f.csv:{i}", value={"id": str(i), "name": "c"}, format="csv")
            )
        elif i % 11 == 5:
            events.append(RawEvent(b'{"id": "not a number"}', f"f.jsonl:{i}"))
        else:
            events.append(RawEvent(b'{"id": %d, "name": "%s"}' % (i, b"x" * (i % 50)), f"f:{i}"))
    return events


def _shipped(
    events: list[RawEvent], lines: Lines | None = None, compression: Compression = Compression.NONE
) -> EncodeRequest:
    """The request as an encode worker receives it."""
    request = EncodeRequest("e", events, lines, compression, None)
    got = pickle.loads(pickle.dumps(request, 5))
    assert isinstance(got, EncodeRequest)
    return got


def test_shipping_keeps_payloads_values_and_formats_in_order() -> None:
    events = [*_events(40), RawEvent(b"", "empty"), RawEvent(b"\x00\xff", "binary")]
    got = _shipped(events).events
    assert [(e.payload, e.value, e.format) for e in got] == [
        (e.payload, e.value, e.format) for e in events
    ]


def test_shipped_events_give_what_the_events_give() -> None:
    for n in (10, 3000):  # below and above the size at which a batch is packed
        events = _events(n)
        expected = CONFIG.build().encode_batch(events)
        outcome = encode(_shipped(events, None, Compression.GZIP), ENCODER)
        records, failures = outcome.records, outcome.failures
        assert failures == expected.failures
        assert outcome.line_failures == []
        assert outcome.line_events == 0
        assert any(reason == "schema" for _, reason, _ in failures)
        framed = frame_many(expected.records)
        assert (len(framed) >= PACK_MIN_BYTES) == (n == 3000)
        assert isinstance(records, Packed)
        assert list(records.lengths) == [len(r) for r in expected.records]
        assert records.unit.raw_size == len(framed)
        if len(framed) < PACK_MIN_BYTES:
            # Framed only: the shard's writer compresses it with what it holds.
            assert records.unit.compression is Compression.NONE
            assert records.unit.data == framed
            continue
        assert records.unit.compression is Compression.GZIP
        reader = open_decompressed(io.BytesIO(records.unit.data), Compression.GZIP, path="unit")
        assert reader.read() == framed


def test_lines_are_split_encoded_and_their_failures_placed() -> None:
    good = [b'{"id": %d, "name": "n%d"}' % (i, i) for i in range(2000)]
    data = b"\n".join(good[:5]) + b'\n\n  \r\n{"id": "x"}\n' + b"z" * 80 + b"\n"
    data += b"\n".join(good[5:]) + b"\n{nope"
    lines = Lines(data, "spool/a.jsonl", 1000, max_line=64)
    events = _events(20)
    batch = RawBatch("s", events, None, lines)
    expected = CONFIG.build().encode_batch(batch.expand())
    outcome = encode(_shipped(events, lines), ENCODER)
    assert isinstance(outcome.records, Packed)
    assert list(outcome.records.lengths) == [len(r) for r in expected.records]
    assert outcome.line_events == 2003  # blank lines are no events; the long one is refused
    assert outcome.failures == [f for f in expected.failures if f[0] < 20]
    at_schema = 1000 + sum(len(g) + 1 for g in good[:5]) + len(b"\n  \r\n")
    at_long = at_schema + len(b'{"id": "x"}\n')
    assert [(ev.where, ev.payload, reason) for ev, reason, _ in outcome.line_failures] == [
        (f"spool/a.jsonl:{at_long}", b"z" * 64, "rejected"),
        (f"spool/a.jsonl:{at_schema}", b'{"id": "x"}', "schema"),
        (f"spool/a.jsonl:{1000 + len(data) - 5}", b"{nope", "malformed"),
    ]
    assert data[at_schema - 1000 :].startswith(b'{"id": "x"}')
