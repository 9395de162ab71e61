"""Partition folders (tfrecordd.outputs.partitions) and the feature reader under them
(tfrecordd.format.features), the reader held to protobuf's reading of the same bytes."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecordd.datasets import PartitionSection
from tfrecordd.errors import ConfigError
from tfrecordd.format import features, proto
from tfrecordd.format.features import FeatureReader, FeatureValue, Row
from tfrecordd.format.wire import ExampleWriter, FeatureType
from tfrecordd.outputs.fieldvalues import sanitize
from tfrecordd.outputs.partitioncap import PartitionCap
from tfrecordd.outputs.partitions import (
    Partitioner,
    TimeRange,
    folder_range,
    time_folder,
    time_prefix,
)
from tfrecordd.schema import FeatureSpec


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


def hourly(zone: str, **kw: Any) -> PartitionSection:
    return PartitionSection(time="arrival", zone=zone, **kw)


def daily(zone: str) -> PartitionSection:
    return PartitionSection(time="arrival", zone=zone, granularity="day")


def folders(spec: PartitionSection, start: float, hours: int) -> list[tuple[str, float, float]]:
    """Each folder met minute by minute from ``start`` on, with its range."""
    out: list[tuple[str, float, float]] = []
    t = start
    while t < start + hours * 3600:
        name = time_folder(spec, t)
        if not out or out[-1][0] != name:
            r = folder_range(spec, name)
            assert r is not None, name
            out.append((name, r.start, r.end))
        t += 60
    return out


# --- time folders --------------------------------------------------------------------------


def test_berlin_fall_back_gives_the_second_pass_its_offset() -> None:
    spec = hourly("Europe/Berlin")
    got = folders(spec, utc(2026, 10, 24, 23), 4)
    assert got == [
        ("dt=2026-10-25/hour=01", utc(2026, 10, 24, 23), utc(2026, 10, 25, 0)),
        ("dt=2026-10-25/hour=02", utc(2026, 10, 25, 0), utc(2026, 10, 25, 1)),
        ("dt=2026-10-25/hour=02+0100", utc(2026, 10, 25, 1), utc(2026, 10, 25, 2)),
        ("dt=2026-10-25/hour=03", utc(2026, 10, 25, 2), utc(2026, 10, 25, 3)),
    ]
    assert [name for name, _, _ in got] == sorted(name for name, _, _ in got)
    r = folder_range(spec, "dt=2026-10-25/hour=02+0100/country=de")
    assert r == TimeRange(
        utc(2026, 10, 25, 1),
        utc(2026, 10, 25, 2),
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    )


def test_berlin_spring_forward_skips_the_hour_that_does_not_happen() -> None:
    spec = hourly("Europe/Berlin")
    assert [name for name, _, _ in folders(spec, utc(2026, 3, 29, 0), 2)] == [
        "dt=2026-03-29/hour=01",
        "dt=2026-03-29/hour=03",
    ]
    assert folder_range(spec, "dt=2026-03-29/hour=02") is None
    r = folder_range(spec, "dt=2026-03-29/hour=01")
    assert r is not None
    assert (r.start_local, r.end_local) == (
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",
    )


def test_new_york_both_changes() -> None:
    spec = hourly("America/New_York")
    assert [name for name, _, _ in folders(spec, utc(2026, 11, 1, 5), 3)] == [
        "dt=2026-11-01/hour=01",
        "dt=2026-11-01/hour=01-0500",
        "dt=2026-11-01/hour=02",
    ]
    assert [name for name, _, _ in folders(spec, utc(2026, 3, 8, 6), 2)] == [
        "dt=2026-03-08/hour=01",
        "dt=2026-03-08/hour=03",
    ]


def test_lord_howe_half_hour_changes() -> None:
    spec = hourly("Australia/Lord_Howe")
    # Back from +11:00 to +10:30 at 02:00: local 01:30-02:00 happens twice.
    assert folders(spec, utc(2026, 4, 4, 14), 2) == [
        ("dt=2026-04-05/hour=01", utc(2026, 4, 4, 14), utc(2026, 4, 4, 15)),
        ("dt=2026-04-05/hour=01+1030", utc(2026, 4, 4, 15), utc(2026, 4, 4, 15, 30)),
        ("dt=2026-04-05/hour=02", utc(2026, 4, 4, 15, 30), utc(2026, 4, 4, 16, 30)),
    ]
    # Forward from +10:30 to +11:00 at 02:00: hour 02 is half an hour long.
    assert folders(spec, utc(2026, 10, 3, 14, 30), 2) == [
        ("dt=2026-10-04/hour=01", utc(2026, 10, 3, 14, 30), utc(2026, 10, 3, 15, 30)),
        ("dt=2026-10-04/hour=02", utc(2026, 10, 3, 15, 30), utc(2026, 10, 3, 16)),
        ("dt=2026-10-04/hour=03", utc(2026, 10, 3, 16), utc(2026, 10, 3, 17)),
    ]


def test_kolkata_hours_start_at_half_past_utc() -> None:
    spec = hourly("Asia/Kolkata")
    assert time_folder(spec, utc(2026, 1, 1, 0, 29, 59)) == "dt=2026-01-01/hour=05"
    assert time_folder(spec, utc(2026, 1, 1, 0, 30)) == "dt=2026-01-01/hour=06"
    r = folder_range(spec, "dt=2026-01-01/hour=06")
    assert r == TimeRange(
        utc(2026, 1, 1, 0, 30),
        utc(2026, 1, 1, 1, 30),
        "2026-01-01T06:00:00+05:30",
        "2026-01-01T07:00:00+05:30",
    )


def test_utc_hours_and_days() -> None:
    assert time_folder(hourly("UTC"), utc(2026, 11, 25, 3, 59, 59)) == "dt=2026-11-25/hour=03"
    assert time_folder(hourly("UTC"), utc(2026, 11, 25, 3) - 0.5) == "dt=2026-11-25/hour=02"
    assert time_folder(daily("UTC"), utc(2026, 11, 25, 23, 59)) == "dt=2026-11-25"
    r = folder_range(daily("UTC"), "dt=2026-11-25")
    assert r is not None
    assert (r.start, r.end) == (utc(2026, 11, 25), utc(2026, 11, 26))
    assert r.start_local == "2026-11-25T00:00:00+00:00"


def test_days_are_local_dates_of_23_or_25_hours() -> None:
    spec = daily("Europe/Berlin")
    long_day = folder_range(spec, "dt=2026-10-25")
    short_day = folder_range(spec, "dt=2026-03-29")
    assert long_day is not None
    assert short_day is not None
    assert long_day.end - long_day.start == 25 * 3600
    assert short_day.end - short_day.start == 23 * 3600
    assert time_folder(spec, utc(2026, 10, 24, 22)) == "dt=2026-10-25"


def test_a_date_that_comes_back_after_midnight_gets_its_offset() -> None:
    # St. John's went back from -02:30 to -03:30 at 00:01 local until 2011.
    spec = hourly("America/St_Johns")
    names = [name for name, _, _ in folders(spec, utc(1990, 10, 28, 1, 30), 4)]
    assert names == [
        "dt=1990-10-27/hour=23",
        "dt=1990-10-28/hour=00",
        "dt=1990-10-27/hour=23-0330",
        "dt=1990-10-28/hour=00-0330",
        "dt=1990-10-28/hour=01",
    ]
    days = [name for name, _, _ in folders(daily("America/St_Johns"), utc(1990, 10, 28), 6)]
    assert days == ["dt=1990-10-27", "dt=1990-10-28", "dt=1990-10-27-0330", "dt=1990-10-28-0330"]


def test_folder_range_refuses_what_is_not_a_folder_of_the_layout() -> None:
    spec = hourly("Europe/Berlin")
    for folder in [
        "",
        "country=de",
        "dt=2026-10-25",
        "dt=2026-02-30/hour=01",
        "dt=2026-10-25/hour=24",
        "dt=2026-10-25/hour=1",
        "dt=2026-10-25/hour=03+0100",  # no such pass
        "dt=2026-10-25/hour=02+0200",
    ]:
        assert folder_range(spec, folder) is None, folder
    day = folder_range(daily("UTC"), "dt=2026-10-25/hour=02")  # a field named hour
    assert day is not None
    assert day.end - day.start == 86400
    assert folder_range(PartitionSection(fields=["a"]), "dt=2026-10-25/hour=02") is None
    assert time_prefix(spec, "dt=2026-10-25/hour=02+0100/country=de") == (
        "dt=2026-10-25/hour=02+0100"
    )
    assert time_prefix(daily("UTC"), "dt=2026-10-25/country=de") == "dt=2026-10-25"
    assert time_prefix(spec, "country=de/device=x") == ""
    assert time_prefix(PartitionSection(fields=["a"]), "a=dt") == ""


def test_folder_range_round_trip_over_a_year_of_hours() -> None:
    spec = hourly("Europe/Berlin")
    t = utc(2026, 1, 1)
    previous_end = None
    while t < utc(2027, 1, 1):
        name = time_folder(spec, t)
        r = folder_range(spec, name)
        assert r is not None
        assert r.start <= t < r.end
        assert previous_end is None or previous_end == r.start
        previous_end = r.end
        t = r.end


def test_times_outside_the_years_are_refused() -> None:
    spec = hourly("America/New_York")
    with pytest.raises(ValueError, match="years"):
        time_folder(spec, utc(1, 1, 1, 1))  # still year 0 in New York
    with pytest.raises(ValueError, match="years"):
        time_folder(spec, 253402300800.0)
    with pytest.raises(ValueError, match="not a time"):
        time_folder(spec, float("nan"))
    assert time_folder(spec, utc(1, 1, 2)) == "dt=0001-01-01/hour=19"
    assert time_folder(hourly("Asia/Tokyo"), utc(9999, 12, 31, 14, 59)) == ("dt=9999-12-31/hour=23")
    r = folder_range(hourly("Asia/Tokyo"), "dt=9999-12-31/hour=23")
    assert r is not None
    assert r.end_local == "10000-01-01T00:00:00+09:00"


# --- sanitize ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"de", "de"),
        ("en-US", "en-US"),
        (b"v1.2_rc", "v1.2_rc"),
        (-7, "-7"),
        (0, "0"),
        (1.5, "1.5"),
        (float("inf"), "inf"),
        (b"a" * 64, "a" * 64),
        (b"a" * 65, None),
        (b"", None),
        (b".hidden", None),
        (b"_SUCCESS", None),
        (b"_other", None),
        (b"a=b", None),
        (b"a/b", None),
        (b"..", None),
        (b"a b", None),
        (b"caf\xc3\xa9", None),
        (b"\xff", None),
        (b"%2F", None),
        (True, None),
        (None, None),
        (10**70, None),
        ([b"x"], None),
    ],
)
def test_sanitize(value: object, expected: str | None) -> None:
    assert sanitize(value) == expected


# --- the partitioner -----------------------------------------------------------------------

FEATURES: Mapping[str, FeatureSpec] = {
    "ts": FeatureSpec(type=FeatureType.INT64, time_unit="ms"),
    "when": FeatureSpec(type=FeatureType.BYTES),
    "country": FeatureSpec(type=FeatureType.BYTES),
    "n": FeatureSpec(type=FeatureType.INT64),
    "score": FeatureSpec(type=FeatureType.FLOAT),
}
WRITER = ExampleWriter([(name, spec.type) for name, spec in FEATURES.items()])


def record(**values: Any) -> bytes:
    return WRITER.encode([values.get(name) for name in FEATURES])


def test_event_time_and_fields() -> None:
    spec = PartitionSection(
        time="event", time_field="ts", zone="Europe/Berlin", fields=["country", "n"]
    )
    ms = int(utc(2026, 10, 25, 1, 30) * 1000)
    records = [
        record(ts=[ms], country=[b"de"], n=[3]),
        record(ts=[ms - 3_600_000], country=[b"de"], n=[3]),
        record(ts=[ms + 1], country=[b"de"], n=[3, 4]),
        record(ts=[ms], country=[b"d/e"], n=[]),
        record(ts=[-1], country=[b"fr"], n=[-2]),
    ]
    got = Partitioner(spec, FEATURES).assign(records, 0.0)
    assert got.groups == {
        "dt=2026-10-25/hour=02+0100/country=de/n=3": [0, 2],
        "dt=2026-10-25/hour=02/country=de/n=3": [1],
        "dt=2026-10-25/hour=02+0100/country=_other/n=_other": [3],
        "dt=1970-01-01/hour=00/country=fr/n=-2": [4],
    }
    s = ms / 1000
    assert got.times["dt=2026-10-25/hour=02+0100/country=de/n=3"] == (s, s + 0.001)
    assert got.times["dt=1970-01-01/hour=00/country=fr/n=-2"] == (-0.001, -0.001)
    assert got.refused == {}
    assert got.fallbacks == {"unsafe": 1, "missing": 1}


def test_rfc3339_event_times() -> None:
    spec = PartitionSection(time="event", time_field="when", granularity="day", zone="UTC")
    records = [
        record(when=[b"2026-11-25T03:04:05.25+01:00"]),
        record(when=[b"2026-11-25 23:59:59Z"]),
        record(when=[b"yesterday"]),
        record(when=[b"0000-12-31T23:00:00Z"]),
        record(when=[b"\xff"]),
        record(ts=[5]),
    ]
    got = Partitioner(spec, FEATURES).assign(records, 0.0)
    assert got.groups == {"dt=2026-11-25": [0, 1]}
    assert got.times == {
        "dt=2026-11-25": (utc(2026, 11, 25, 2, 4, 5) + 0.25, utc(2026, 11, 25, 23, 59, 59))
    }
    assert set(got.refused) == {2, 3, 4, 5}
    assert "not an RFC 3339 timestamp" in got.refused[2]
    assert "invalid date" in got.refused[3]
    assert "not UTF-8" in got.refused[4]
    assert got.refused[5] == "event time feature 'when' is missing or empty"


def test_refusal_details() -> None:
    spec = PartitionSection(time="event", time_field="ts")
    far = 253402300800 * 1000
    records = [
        record(),
        record(ts=[]),
        record(ts=[far]),
        record(ts=[-62135596800 * 1000 - 1]),
        b"\x0a\x05garbage",
        proto.Example(
            features=proto.Features(feature={"ts": proto.Feature(float_list={"value": [1.0]})})
        ).SerializeToString(),
        b"",
        record(ts=[far - 1]),
    ]
    got = Partitioner(spec, FEATURES).assign(records, 0.0)
    assert got.groups == {"dt=9999-12-31/hour=23": [7]}
    assert got.refused == {
        0: "event time feature 'ts' is missing or empty",
        1: "event time feature 'ts' is missing or empty",
        2: f"event time {far} ms is outside years 1 to 9999 (UTC or UTC)",
        3: f"event time {-62135596800 * 1000 - 1} ms is outside years 1 to 9999 (UTC or UTC)",
        4: "not a well-formed Example: its event time feature 'ts' cannot be read",
        5: "event time feature 'ts' holds float values, not int64",
        6: "event time feature 'ts' is missing or empty",
    }


def test_arrival_none_and_unpartitioned() -> None:
    records = [record(country=[b"de"]), record(), record(country=[b"de"], score=[0.1])]
    arrival = utc(2026, 11, 25, 3, 30)
    got = Partitioner(hourly("UTC"), FEATURES).assign(records, arrival)
    assert got.groups == {"dt=2026-11-25/hour=03": [0, 1, 2]}
    assert got.times == {"dt=2026-11-25/hour=03": (arrival, arrival)}
    by_field = Partitioner(PartitionSection(fields=["country", "score"]), FEATURES)
    got = by_field.assign(records, arrival)
    assert got.groups == {
        "country=de/score=_other": [0],
        "country=_other/score=_other": [1],
        "country=de/score=0.1": [2],
    }
    assert got.times == {}
    assert got.fallbacks == {"missing": 3}
    plain = Partitioner(PartitionSection(), FEATURES)
    assert plain.assign(records, arrival).groups == {"": [0, 1, 2]}
    assert plain.assign([], arrival).groups == {}


def test_partitioner_refuses_a_layout_the_schema_cannot_fill() -> None:
    spec = PartitionSection(time="event", time_field="n", fields=["nope"])
    with pytest.raises(ConfigError) as e:
        Partitioner(spec, FEATURES)
    assert e.value.errors == [
        "partition.time_field: 'n' must be an int64 feature with time_unit, or a bytes "
        "feature of RFC 3339 text",
        "partition.fields: no feature 'nope'",
    ]


def test_partition_cap() -> None:
    spec = PartitionSection(time="arrival", fields=["country", "n"], max_partitions=2)
    cap = PartitionCap(spec)
    assert cap.place("dt=2026-11-25/hour=03/country=de/n=1") == (
        "dt=2026-11-25/hour=03/country=de/n=1",
        None,
    )
    assert cap.place("dt=2026-11-25/hour=03/country=_other/n=_other")[1] is None
    assert cap.place("dt=2026-11-25/hour=04/country=fr/n=1")[1] is None
    assert cap.place("dt=2026-11-25/hour=04/country=it/n=1") == (
        "dt=2026-11-25/hour=04/country=_other/n=_other",
        "over-cap",
    )
    assert cap.place("dt=2026-11-26/hour=00/country=de/n=1")[1] is None
    fields_only = PartitionCap(PartitionSection(fields=["c"], max_partitions=1))
    assert fields_only.place("c=a") == ("c=a", None)
    assert fields_only.place("c=b") == ("c=_other", "over-cap")
    assert PartitionCap(hourly("UTC")).place("dt=2026-11-25/hour=03") == (
        "dt=2026-11-25/hour=03",
        None,
    )


# --- the feature reader, against protobuf ---------------------------------------------------

NAMES = ["a", "b", "ts", "k" * 130, ""]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    head = _varint(number << 3 | wire)
    return head + (_varint(len(payload)) + payload if wire == 2 else payload)


_UNKNOWN = st.sampled_from(
    [
        _field(9, 0, _varint(300)),
        _field(9, 1, b"\x01" * 8),
        _field(9, 5, b"\x02" * 4),
        _field(9, 2, b"zz"),
        _field(9, 3, _field(1, 0, b"\x05") + _varint(9 << 3 | 4)),
        _field(1, 0, b"\x07"),  # a known number with another wire type: unknown
    ]
)


@st.composite
def _list(draw: st.DrawFn, kind: int) -> bytes:
    """A value list's payload in any encoding protobuf reads, sometimes with unknown fields."""
    if kind == 1:
        values = draw(st.lists(st.binary(max_size=140), max_size=3))
        parts = [_field(1, 2, v) for v in values]
    elif kind == 2:
        floats = draw(st.lists(st.floats(width=32), max_size=3))
        packed = b"".join(struct.pack("<f", f) for f in floats)
        unpacked = [_field(1, 5, struct.pack("<f", f)) for f in floats]
        parts = [_field(1, 2, packed)] if draw(st.booleans()) else unpacked
    else:
        ints = draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
        packed = b"".join(_varint(v) for v in ints)
        unpacked = [_field(1, 0, _varint(v)) for v in ints]
        parts = [_field(1, 2, packed)] if draw(st.booleans()) else unpacked
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(_UNKNOWN))
    return b"".join(parts)


@st.composite
def _feature(draw: st.DrawFn) -> bytes:
    """A Feature's payload: no kind, one kind, a kind given twice, or two kinds."""
    kinds = draw(st.lists(st.integers(1, 3), max_size=3))
    parts = [_field(kind, 2, draw(_list(kind))) for kind in kinds]
    if draw(st.booleans()):
        parts.append(draw(_UNKNOWN))
    return b"".join(parts)


@st.composite
def example_bytes(draw: st.DrawFn) -> bytes:
    """A serialized Example: entries in any order, keys repeated, values split over fields, key
    after value, Features given twice, unknown fields at every level."""
    entries = []
    for _ in range(draw(st.integers(0, 6))):
        key = _field(1, 2, draw(st.sampled_from([*NAMES, "other"])).encode())
        values = [_field(2, 2, draw(_feature())) for _ in range(draw(st.integers(0, 2)))]
        parts = [key, *values] if draw(st.booleans()) else [*values, key]
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(_UNKNOWN))
        entries.append(_field(1, 2, b"".join(parts)))
    cut = draw(st.integers(0, len(entries)))
    groups = [entries[:cut], entries[cut:]] if draw(st.booleans()) else [entries]
    parts = [_field(1, 2, b"".join(g)) for g in groups]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(_UNKNOWN))
    return b"".join(parts)


def oracle(data: bytes, names: list[str]) -> Row | None:
    """Protobuf's reading: each name's first value, or None for a record it refuses."""
    message: Any = proto.Example()
    try:
        message.ParseFromString(data)
    except Exception:
        return None
    got: list[FeatureValue | None] = []
    for name in names:
        values = (
            proto.feature_values(message.features.feature[name])
            if name in message.features.feature
            else []
        )
        got.append(values[0] if values else None)
    return tuple(got)


def _bits(value: FeatureValue | None) -> object:
    return struct.pack("<f", value) if isinstance(value, float) else value


def same(a: Row | None, b: Row | None) -> bool:
    """Equal, a float NaN equal to a NaN of the same bits."""
    if a is None or b is None:
        return a is b
    return [_bits(v) for v in a] == [_bits(v) for v in b]


def read_both(names: list[str], data: bytes) -> Row | None:
    """The reading of ``data``, the same in C (where built) and in Python."""
    reader = FeatureReader(names)
    got = reader.read(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(features, "COMPILED", False)
        python = reader.read(data)
        assert all(same(row, python) for row in reader.read_batch([data, data]))
    assert same(got, python), (got, python)
    return got


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(example_bytes(), st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
def test_reader_reads_what_protobuf_reads(data: bytes, names: list[str]) -> None:
    expected = oracle(data, names)
    assert expected is not None
    got = read_both(names, data)
    assert same(got, expected), (got, expected)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(example_bytes(), st.data())
def test_reader_never_raises_and_agrees_wherever_protobuf_parses(
    data: bytes, draw: st.DataObject
) -> None:
    mutated = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        op = draw.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw.draw(st.integers(0, len(mutated)))
        if op == "flip" and at < len(mutated):
            mutated[at] ^= draw.draw(st.integers(1, 255))
        elif op == "cut":
            del mutated[at:]
        else:
            mutated[at:at] = draw.draw(st.binary(min_size=1, max_size=3))
    names = ["a", "ts", "k" * 130]
    got = read_both(names, bytes(mutated))
    expected = oracle(bytes(mutated), names)
    if expected is not None:
        assert same(got, expected), (got, expected)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_reader_on_any_bytes(data: bytes) -> None:
    read_both(["a", ""], data)
    read_both(["a", ""], b"\x0a" + bytes([len(data)]) + data if len(data) < 128 else data)


def test_reader_on_the_writer_s_records_and_odd_bytes() -> None:
    names = ["ts", "country", "score", "n"]
    data = record(ts=[-5, 7], country=[b"", b"x"], score=[0.5], n=[2**63 - 1])
    assert read_both(names, data) == (-5, b"", 0.5, 2**63 - 1)
    assert read_both(names, b"") == (None, None, None, None)
    assert read_both(names, record(n=[])) == (None, None, None, None)
    assert read_both([], data) == ()
    deep = b"".join(bytes([0x0B]) for _ in range(70)) + b"".join(bytes([0x0C]) for _ in range(70))
    for bad in [
        b"\x0a",
        b"\x0a\x80",
        b"\x00\x00",
        b"\x0b",
        b"\x0a\x02\x0a\x05",
        b"\xff" * 11,
        deep,
    ]:
        assert read_both(names, bad) is None, bad
    # In a group, protobuf lets a field number 0 through, and a group of number 0.
    for odd in [b"K\x00\x00L", b"K\x03\x04L", b"K\x05\x00\x00\x00\x00L", b"K\x02\x01\x00L"]:
        assert read_both(names, odd + data) == oracle(odd + data, names) == read_both(names, data)
    for bad in [b"K\x06L", b"\x03\x04", b"K\x80\x80\x80\x80\x10\x00L"]:
        assert read_both(names, bad + data) is oracle(bad + data, names) is None
    reader = FeatureReader(names)
    assert reader.read_batch([data, b"\x0a"]) == [reader.read(data), None]
    with pytest.raises(ValueError, match="twice"):
        FeatureReader(["a", "a"])


@pytest.mark.skipif(not features.COMPILED, reason="tfrecordd._cexample is not built")
def test_compiled_reader_refuses_what_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="bytes"):
        FeatureReader(["a"]).read_batch(["text"])  # type: ignore[list-item]
