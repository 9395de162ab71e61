"""What travels to an encode worker and back: events shipped as one payload, records packed."""

from __future__ import annotations

import io

from tfrecordd.compression import Compression, open_decompressed
from tfrecordd.framing import frame_many
from tfrecordd.plugin import RawEvent
from tfrecordd.runtime import PACK_MIN_BYTES, _encode_in_worker, _ship, _unship
from tfrecordd.writer import Packed
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

CONFIG = ExampleEncoderConfig.model_validate({"features": {"id": "int64", "name": "bytes"}})


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


def test_shipping_keeps_payloads_values_and_formats_in_order() -> None:
    events = [*_events(40), RawEvent(b"", "empty"), RawEvent(b"\x00\xff", "binary")]
    got = _unship(_ship(events))
    assert [(e.payload, e.value, e.format) for e in got] == [
        (e.payload, e.value, e.format) for e in events
    ]


def test_a_worker_gives_what_the_encoder_gives_in_process() -> None:
    for n in (10, 3000):  # below and above the size at which a batch is packed
        events = _events(n)
        expected = CONFIG.build().encode_batch(events)
        records, failures = _encode_in_worker(CONFIG, _ship(events), Compression.GZIP, None)
        assert failures == expected.failures
        assert any(reason == "schema" for _, reason, _ in failures)
        framed = frame_many(expected.records)
        assert (len(framed) >= PACK_MIN_BYTES) == (n == 3000)
        if len(framed) < PACK_MIN_BYTES:
            assert records == expected.records
            continue
        assert isinstance(records, Packed)
        assert list(records.lengths) == [len(r) for r in expected.records]
        assert records.unit.raw_size == len(framed)
        reader = open_decompressed(io.BytesIO(records.unit.data), Compression.GZIP, path="unit")
        assert reader.read() == framed
