"""Batches of one routed, partitioned source encoded together are joined
(:mod:`tfrecordd.pipeline.joining`): whatever the group (batches of any size, blank ones, ones
of another source between, bad lines), what reaches the writer holds every batch's position once,
in order, with every event counted and every failure in order, and each (dataset, folder) the
same records in the same order as the batches encoded one by one; a folder's parts that frame to
64 KiB or more together are one compressed unit, smaller ones stay framed as they came."""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.config import parse_config
from tfrecordd.events import Lines, RawBatch, RawEvent
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import unpack
from tfrecordd.metrics import Metrics
from tfrecordd.pipeline.encode import EncodeStage
from tfrecordd.pipeline.encodeplan import plan_encoding
from tfrecordd.pipeline.encoding import PACK_MIN_BYTES, EncodedBatch
from tfrecordd.plugin import Registry

CONFIG = """
[daemon]
state_dir = "/nonexistent/state"
[datasets.hours]
encoder = "e"
dir = "/nonexistent/hours"
compression = "gzip"
partition = { time = "event", time_field = "ts", granularity = "hour" }
[datasets.flat]
encoder = "e"
dir = "/nonexistent/flat"
compression = "zlib"
[[sources]]
name = "s"
type = "directory"
path = "/nonexistent/spool"
route = { field = "kind", to = { h = "hours", f = "flat" } }
[[sources]]
name = "plain"
type = "directory"
path = "/nonexistent/plain"
dataset = "flat"
[encoders.e]
type = "example"
[encoders.e.features]
id = "int64"
kind = "bytes"
ts = { type = "int64", time_unit = "s" }
pad = "bytes"
"""

STAGE = EncodeStage(
    plan_encoding(parse_config(tomllib.loads(CONFIG), Registry.from_entry_points())),
    workers=1,
    metrics=Metrics(),
)

# A batch: its source, and per line (kind, hour, pad length); "x" is a line no route names.
LINE = st.tuples(st.sampled_from(["h", "h", "f", "x", "bad"]), st.integers(0, 2), st.integers(0, 3))
BATCH = st.tuples(
    st.sampled_from(["s", "s", "s", "plain", "blank", "plain-blank"]), st.lists(LINE, max_size=30)
)


def _batch(n: int, source: str, lines: list[tuple[str, int, int]], pad: int) -> RawBatch:
    out = []
    for i, (kind, hour, size) in enumerate(lines):
        if kind == "bad":
            out.append(b'{"id": 1, "kind": "h", "ts": ')
            continue
        event = {"id": n * 1000 + i, "kind": kind, "ts": 1_764_000_000 + 3600 * hour}
        event["pad"] = "p" * (pad * size)
        out.append(json.dumps(event).encode())
    text = b"".join(line + b"\n" for line in out)
    if source.endswith("blank"):
        name = "plain" if source == "plain-blank" else "s"
        return RawBatch(name, [], ("token", n), Lines(b"\n  \n", f"b{n}", 0, 1 << 20))
    return RawBatch(source, [], ("token", n), Lines(text, f"b{n}", 0, 1 << 20))


def _records(batches: list[EncodedBatch]) -> dict[tuple[str, str, str], list[bytes]]:
    out: dict[tuple[str, str, str], list[bytes]] = defaultdict(list)
    for b in batches:
        for p in b.parts:
            out[b.source, p.dataset, p.folder].extend(unpack(p.records))
    return dict(out)


@settings(max_examples=150, deadline=None)
@given(st.lists(BATCH, min_size=1, max_size=4), st.sampled_from([1, 200, 2000]))
def test_a_joined_group_holds_every_batch_once_in_order(
    group: list[tuple[str, list[tuple[str, int, int]]]], pad: int
) -> None:
    batches = [_batch(n, source, lines, pad) for n, (source, lines) in enumerate(group)]
    joined = STAGE.encode_all(batches)
    alone = [e for b in batches for e in STAGE.encode_all([b])]
    assert [t for b in joined for t in b.tokens] == [b.token for b in batches]
    assert sum(b.batches for b in joined) == len(batches)
    assert sum(b.events for b in joined) == sum(b.events for b in alone)
    assert [f[1:] for b in joined for f in b.failures] == [f[1:] for b in alone for f in b.failures]
    assert [f[0].where for b in joined for f in b.failures] == [
        f[0].where for b in alone for f in b.failures
    ]
    assert _records(joined) == _records(alone)
    # Batches of another source are never joined, nor are sources' batches across one.
    for b in joined:
        assert {b.source} == {batches[t[1]].source for t in b.tokens}
        if b.batches == 1:
            continue
        raw: dict[tuple[str, str], list[tuple[Compression, int]]] = defaultdict(list)
        for p in b.parts:
            raw[p.dataset, p.folder].append((p.records.unit.compression, p.records.unit.raw_size))
        for units in raw.values():
            if sum(n for _, n in units) < PACK_MIN_BYTES:
                assert {c for c, _ in units} == {Compression.NONE}
            else:
                assert len(units) == 1
                assert units[0][0] is not Compression.NONE


def test_a_busy_group_of_a_partitioned_source_compresses_where_it_encodes() -> None:
    lines = [("h", i % 3, 3) for i in range(600)]
    batches = [_batch(n, "s", lines, 20) for n in range(4)]
    for b in STAGE.encode_all([batches[0]]):
        assert all(p.records.unit.compression is Compression.NONE for p in b.parts)
    (joined,) = STAGE.encode_all(batches)
    assert joined.tokens == tuple(b.token for b in batches)
    assert sorted(p.folder for p in joined.parts) == [
        f"dt=2025-11-24/hour={h}" for h in (16, 17, 18)
    ]
    assert {p.records.unit.compression for p in joined.parts} == {Compression.GZIP}
    assert [p.count for p in joined.parts] == [800, 800, 800]


def test_a_source_of_one_dataset_without_partitions_is_never_joined() -> None:
    batches = [_batch(n, "plain", [("f", 0, 1)] * 5, 10) for n in range(3)]
    assert [b.tokens for b in STAGE.encode_all(batches)] == [(b.token,) for b in batches]


def test_events_not_lines_are_joined_as_well() -> None:
    events = [RawEvent(json.dumps({"id": i, "kind": "h", "ts": 0}).encode(), "e") for i in range(3)]
    batches = [RawBatch("s", events, ("token", n)) for n in range(2)]
    (joined,) = STAGE.encode_all(batches)
    assert joined.tokens == (("token", 0), ("token", 1))
    assert joined.count == 6


def test_a_joined_unit_holds_no_more_than_a_shard_may() -> None:
    capped = CONFIG.replace(
        'partition = { time = "event"', 'max_shard_records = 500\npartition = { time = "event"'
    )
    stage = EncodeStage(
        plan_encoding(parse_config(tomllib.loads(capped), Registry.from_entry_points())),
        workers=1,
        metrics=Metrics(),
    )
    lines = [("h", 0, 3)] * 200
    batches = [_batch(n, "s", lines, 200) for n in range(4)]
    (joined,) = stage.encode_all(batches)
    assert [p.count for p in joined.parts] == [400, 400]  # two units, each under the cap
    assert {p.records.unit.compression for p in joined.parts} == {Compression.GZIP}
    # A part the cap keeps alone is compressed as a batch encoded alone would be.
    (three,) = stage.encode_all([_batch(n, "s", [("h", 0, 3)] * 400, 200) for n in range(3)])
    assert [p.count for p in three.parts] == [400, 400, 400]
    assert {p.records.unit.compression for p in three.parts} == {Compression.GZIP}
    assert {p.records.unit.compression for p in joined.parts} == {Compression.GZIP}
    alone = [e for b in batches for e in stage.encode_all([b])]
    assert [r for p in joined.parts for r in unpack(p.records)] == [
        r for e in alone for p in e.parts for r in unpack(p.records)
    ]
