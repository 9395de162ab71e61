"""Time partition folders across every zone's clock changes, 1970 to 2037.

Each example takes a zone (from a fixed list of awkward ones, those with daylight saving time,
or any of ``zoneinfo.available_timezones()``), hunts one of its next changes of UTC offset after
a random instant (two-day steps, then bisection to the second; a zone that never changes gives a
plain window), and walks the folders of the 60 hours around it. Whatever the zone, the change
and the granularity:

(a) every instant lies in the range (``folder_range``) of its folder;
(b) hour folders last at most an hour, so no two consecutive hours share one;
(c) each range is a non-empty half-open interval, the ranges met in time order tile time with no
    gap and no overlap, and no folder name comes back later;
(d) within a day, hour folders sort by name as they pass in time, except on a day where clocks
    went back over local time spanning two clock hours (the documented exception).

The Partitioner's cached path is held to ``time_folder`` on records timed around the change.
"""

from __future__ import annotations

import zoneinfo
from collections import defaultdict
from datetime import UTC, datetime
from typing import Literal

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.support import CI_DERANDOMIZED, examples
from tfrecordd.datasets import PartitionSection
from tfrecordd.format.wire import ExampleWriter, FeatureType
from tfrecordd.outputs.partitions import Partitioner, folder_range, time_folder, time_prefix
from tfrecordd.schema import FeatureSpec

AWKWARD = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/St_Johns",  # went back at 00:01, across midnight, until 2011
    "America/Sao_Paulo",  # went back at midnight
    "Australia/Lord_Howe",  # 30-minute changes
    "Asia/Kolkata",
    "Asia/Kathmandu",  # +05:30 to +05:45 in 1986
    "Pacific/Chatham",  # +13:45 / +12:45, back at 03:45
    "Antarctica/Troll",  # two hours back
    "Antarctica/Casey",
    "Pacific/Apia",  # skipped a whole day in 2011
    "Pacific/Kiritimati",  # +14:00
    "Africa/Monrovia",  # -00:44:30 until 1972
    "Africa/Casablanca",  # back for Ramadan
    "Asia/Chita",
    "Asia/Hong_Kong",
    "Asia/Bishkek",
]
ZONES = sorted(zoneinfo.available_timezones())
HOUR, DAY = 3600, 86400
END = int(datetime(2038, 1, 1, tzinfo=UTC).timestamp())


def offset(zone: zoneinfo.ZoneInfo, t: int) -> int:
    delta = datetime.fromtimestamp(t, zone).utcoffset()
    assert delta is not None
    return int(delta.total_seconds())


def next_change(zone: zoneinfo.ZoneInfo, t: int) -> int | None:
    """The first second after ``t`` (before 2038) at which the offset changes, found in steps
    of two days (a change undone within them is missed: this only picks windows)."""
    before = offset(zone, t)
    for u in range(t + 2 * DAY, END, 2 * DAY):
        if offset(zone, u) != before:
            lo, hi = u - 2 * DAY, u
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(zone, mid) == before else (lo, mid)
            return hi
    return None


DAYLIGHT = [
    name
    for name in ZONES
    if offset(zoneinfo.ZoneInfo(name), 1610668800) != offset(zoneinfo.ZoneInfo(name), 1626307200)
]
"""The zones with daylight saving time in 2021 (January and July offsets differ)."""


def spans_two_hours(zone: zoneinfo.ZoneInfo, change: int) -> bool:
    """Whether clocks went back at ``change`` over local time spanning two clock hours."""
    old, new = offset(zone, change - 1), offset(zone, change)
    return new < old and (change + new) // HOUR != (change + old - 1) // HOUR


@st.composite
def windows(draw: st.DrawFn) -> tuple[str, int, int]:
    """A zone, the k-th change of its offset after an instant from 1970 to 2037 (that instant
    if none comes) and a random second near it."""
    name = draw(st.sampled_from(AWKWARD) | st.sampled_from(DAYLIGHT) | st.sampled_from(ZONES))
    zone = zoneinfo.ZoneInfo(name)
    year = int(datetime(draw(st.integers(1970, 2037)), 1, 1, tzinfo=UTC).timestamp())
    change: int | None = year + draw(st.integers(0, 364)) * DAY
    for _ in range(draw(st.integers(1, 4))):
        assert change is not None
        found = next_change(zone, change)
        if found is None:
            break
        change = found
    assert change is not None
    old, new = offset(zone, change - 1), offset(zone, change)
    event("clocks go " + ("back" if new < old else "forward" if new > old else "nowhere"))
    return name, change, draw(st.integers(-30 * HOUR, 30 * HOUR))


def tiling(spec: PartitionSection, start: int, stop: int) -> list[tuple[str, float, float]]:
    """The folders from ``start`` to ``stop`` in time order, each with its range, checked as
    they are met: (a) and (c)."""
    met: list[tuple[str, float, float]] = []
    t: float = start
    while t < stop:
        name = time_folder(spec, t)
        r = folder_range(spec, name)
        assert r is not None, name
        assert r.start <= t < r.end, (name, t, r)  # (a)
        assert r.start < r.end  # (c)
        if met:
            assert met[-1][2] == r.start, (met[-1], name, r)  # (c): no gap, no overlap
            assert name not in {m[0] for m in met}, name  # (c): a name never comes back
        if spec.granularity == "hour":
            assert r.end - r.start <= HOUR, (name, r)  # (b)
        met.append((name, r.start, r.end))
        t = r.end
    return met


@settings(max_examples=examples(150, 1500), derandomize=CI_DERANDOMIZED, deadline=None)
@given(windows(), st.lists(st.integers(-30 * HOUR, 30 * HOUR), min_size=1, max_size=12))
def test_hour_folders_around_clock_changes(
    window: tuple[str, int, int], instants: list[int]
) -> None:
    name, change, jitter = window
    spec = PartitionSection(time="arrival", zone=name)
    met = tiling(spec, change - 30 * HOUR + jitter % HOUR, change + 30 * HOUR)
    for d in instants:
        t = change + d
        assert time_folder(spec, t) != time_folder(spec, t + HOUR)  # (b)
        inside = [m for m in met if m[1] <= t < m[2]]
        assert inside == [] or inside[0][0] == time_folder(spec, t + 0.5)  # (a), within a second
    by_day: dict[str, list[str]] = defaultdict(list)
    for folder, _, _ in met:
        by_day[folder.split("/")[0]].append(folder)
    zone = zoneinfo.ZoneInfo(name)
    for day, in_time in by_day.items():
        if in_time != sorted(in_time):  # (d), but for the documented exception
            assert spans_two_hours(zone, change), (day, in_time)


@settings(max_examples=examples(60, 600), derandomize=CI_DERANDOMIZED, deadline=None)
@given(windows())
def test_day_folders_around_clock_changes(window: tuple[str, int, int]) -> None:
    name, change, jitter = window
    spec = PartitionSection(time="arrival", zone=name, granularity="day")
    for _, start, end in tiling(spec, change - 50 * HOUR + jitter, change + 50 * HOUR):
        assert end - start <= 50 * HOUR


WRITER = ExampleWriter([("ts", FeatureType.INT64), ("c", FeatureType.BYTES)])
FEATURES = {
    "ts": FeatureSpec(type=FeatureType.INT64, time_unit="ms"),
    "c": FeatureSpec(type=FeatureType.BYTES),
}


@settings(max_examples=examples(60, 600), derandomize=CI_DERANDOMIZED, deadline=None)
@given(
    windows(),
    st.lists(st.integers(-5 * HOUR * 1000, 5 * HOUR * 1000), min_size=1, max_size=60),
    st.sampled_from(["hour", "day"]),
)
def test_partitioner_places_each_record_as_time_folder_does(
    window: tuple[str, int, int], offsets_ms: list[int], granularity: Literal["hour", "day"]
) -> None:
    name, change, _ = window
    spec = PartitionSection(
        time="event", time_field="ts", zone=name, granularity=granularity, fields=["c"]
    )
    stamps = [change * 1000 + d for d in offsets_ms]
    records = [WRITER.encode([[ms], [b"x"]]) for ms in stamps]
    partitioner = Partitioner(spec, FEATURES)
    for _ in range(2):  # the second time through the filled cache
        got = partitioner.assign(records, 0.0)
        assert not got.refused
        for folder, indexes in got.groups.items():
            assert folder.endswith("/c=x")
            times = [stamps[i] / 1000 for i in indexes]
            assert got.times[folder] == (min(times), max(times))
            for t in times:
                assert time_prefix(spec, folder) == time_folder(spec, t)
