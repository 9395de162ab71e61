"""Records grouped by the hour of their event time in C (``hour_groups``): the same groups, and
the same folders, spans and refusals from :meth:`Partitioner.assign`, as reading each record in
Python and placing it on its own."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_partitions import FEATURES, example_bytes, record, utc
from tfrecordd.datasets import PartitionSection
from tfrecordd.format import features
from tfrecordd.format.features import FeatureReader, HourGroup, hour_groups
from tfrecordd.outputs import partitions
from tfrecordd.outputs.partitions import Assigned, Partitioner
from tfrecordd.schema import FeatureSpec

pytestmark = pytest.mark.skipif(not features.COMPILED, reason="the C extension is not built")

# Around daylight-saving changes, offsets with minutes, and the ends of the years allowed.
INSTANTS = [
    utc(2026, 3, 29, 0, 59, 59),
    utc(2026, 3, 29, 1, 30),
    utc(2026, 10, 25, 0, 30),
    utc(2026, 10, 25, 1, 0),
    utc(2026, 10, 25, 1, 59, 59),
    utc(2026, 11, 1, 5, 30),
    utc(2026, 4, 4, 15, 10),
    utc(2026, 10, 3, 15, 40),
    0.0,
    -0.5,
    -3600.0,
    -62135596800.0,
    253402300799.0,
    253402300800.0,
    9.3e18 / 1e9,
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


def python_groups(records: list[bytes], per_second: int) -> tuple[list[HourGroup], list[int]]:
    """What ``hour_groups`` must give: each record read by the reader, grouped here."""
    groups: dict[int, HourGroup] = {}
    rest = []
    for i, row in enumerate(FeatureReader(["ts"]).read_batch(records)):
        value = row[0] if row is not None else None
        if type(value) is not int:
            rest.append(i)
            continue
        hour = value // per_second // 3600
        if hour not in groups:
            groups[hour] = (hour, [], value, value)
        _, indexes, low, high = groups[hour]
        indexes.append(i)
        groups[hour] = (hour, indexes, min(low, value), max(high, value))
    return list(groups.values()), rest


@st.composite
def time_records(draw: st.DrawFn, per_second: int) -> bytes:
    """A record with an int64 time near an instant of :data:`INSTANTS` (or anywhere), or none,
    or a time of another kind, or any Example protobuf reads."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(example_bytes())
    if choice == 1:
        return record(ts=[], country=[b"de"])
    if choice == 2:
        return record(country=[b"de"])
    if choice == 3:
        return record(ts=[draw(st.integers(-(2**63), 2**63 - 1))])
    at = draw(st.sampled_from(INSTANTS)) + draw(st.integers(-5400, 5400))
    value = max(-(2**63), min(2**63 - 1, int(at * per_second)))
    value = max(-(2**63), min(2**63 - 1, value + draw(st.integers(-1, 1))))
    return record(ts=[value], n=[draw(st.integers(0, 3))])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 1000, 10**6, 10**9]), st.data())
def test_hour_groups_agree_with_the_reader(per_second: int, data: st.DataObject) -> None:
    records = data.draw(st.lists(time_records(per_second), max_size=40))
    assert hour_groups(records, "ts", per_second) == python_groups(records, per_second)


def test_hour_groups_of_many_hours() -> None:
    # Past 32 distinct hours a batch's groups are found through a dict: every hour twice over,
    # in an order that moves back and forth, and a record of no time between.
    hours = [h * 7919 % 300 - 150 for h in range(300)]
    records = [record(ts=[h * 3600 + k]) for k in (5, 1) for h in hours]
    records.insert(100, record(country=[b"x"]))
    assert hour_groups(records, "ts", 1) == python_groups(records, 1)
    assert len(python_groups(records, 1)[0]) == 300


def test_hour_groups_refuse_what_is_not_bytes() -> None:
    with pytest.raises(TypeError):
        hour_groups([record(ts=[1]), "x"], "ts", 1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="per_second"):
        hour_groups([record(ts=[1])], "ts", 0)


def _spec(zone: str, granularity: Any, fields: list[str]) -> PartitionSection:
    return PartitionSection(
        time="event", time_field="ts", zone=zone, granularity=granularity, fields=fields
    )


def record_by_record(partitioner: Partitioner, records: list[bytes]) -> Assigned:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partitions, "hour_groups", lambda *_: None)
        return partitioner.assign(records, 0.0)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(ZONES),
    st.sampled_from(["hour", "day"]),
    st.sampled_from(["s", "ms", "ns"]),
    st.data(),
)
def test_assign_places_as_record_by_record(
    zone: str, granularity: str, unit: Any, data: st.DataObject
) -> None:
    per_second = {"s": 1, "ms": 1000, "ns": 10**9}[unit]
    feature_set = dict(FEATURES) | {"ts": FeatureSpec(type=FEATURES["ts"].type, time_unit=unit)}
    spec = _spec(zone, granularity, data.draw(st.sampled_from([[], ["n"]])))
    records = data.draw(st.lists(time_records(per_second), max_size=40))
    # A partitioner that has seen hours before (its folder cache filled), or a new one.
    warm = Partitioner(spec, feature_set)
    warm.assign(data.draw(st.lists(time_records(per_second), max_size=10)), 0.0)
    for compiled in (Partitioner(spec, feature_set), warm):
        got = compiled.assign(records, 0.0)
        expected = record_by_record(Partitioner(spec, feature_set), records)
        assert list(got.groups.items()) == list(expected.groups.items())
        assert got.times == expected.times
        assert got.refused == expected.refused
        assert got.fallbacks == expected.fallbacks
