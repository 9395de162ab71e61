"""Hive-style partition folders for a dataset's shards: ``dt=2026-11-25/hour=03/country=de``.

A folder is the time segments first, then one ``NAME=value`` per field of ``partition.fields``
in that order; an unpartitioned dataset's folder is ``""``.

Time segments (``time = "event"`` or ``"arrival"``) name the local date and, for
``granularity = "hour"``, the local clock hour in ``partition.zone``: ``dt=YYYY-MM-DD`` then
``hour=HH``. Each instant has exactly one folder, each folder holds one interval of time
``[start, end)`` (:func:`folder_range`), and no two folders overlap:

- Clocks going forward: the skipped local hour has no folder; an hour partly skipped (a
  30-minute shift) is the part that happens.
- Clocks going back: the first pass of the repeated clock hour is ``hour=HH``; the second pass
  (the later instants, ``fold=1``) is ``hour=HH+hhmm``, its UTC offset (Europe/Berlin on
  2026-10-25: ``hour=02`` is 00:00-01:00 UTC, ``hour=02+0100`` is 01:00-02:00 UTC). No hour
  folder holds more than an hour. Within a day, names sort as their hours pass
  (``02`` < ``02+0100`` < ``03``) wherever the repeated local time lies within one clock hour;
  where it spans two (Pacific/Chatham's 02:45-03:45, Antarctica/Troll's 01:00-03:00), a
  second pass sorts right after its own first pass, before the next hour's first pass.
- A day folder is a local date, 23 to 25 hours long. A date that comes back after the next one
  began (clocks going back across midnight, as America/St_Johns' did at 00:01) gets
  ``dt=YYYY-MM-DD+hhmm`` for its second pass, the same rule as hours.
- Offsets with minutes (Asia/Kolkata, Asia/Kathmandu, Australia/Lord_Howe's 30-minute shift)
  follow the same rules: a folder is a local clock hour, whatever UTC time it starts at. An
  offset with seconds (before 1972 in a few zones) is written ``+hhmmss``.

Event times are read from the record (``time_field``): an ``int64`` feature with a
``time_unit`` holds a count of that unit since the epoch, a ``bytes`` feature RFC 3339 text; its
first value counts. A record whose time is missing, empty, of another kind, not RFC 3339, or
outside years 1 to 9999 (in UTC or in the zone) is refused, with what was wrong. Where the C
extension is built, a batch's int64 times are grouped by UTC hour in one pass
(:func:`~tfrecordd.format.features.hour_groups`) and each hour that lies in one folder goes there
whole; the rest are placed record by record, to the same folders.

Field values: the feature's first value, ``int64`` as decimal text, ``bytes`` as UTF-8 text,
``float`` as its shortest repr. A value that is not a safe folder name
(:func:`~tfrecordd.outputs.fieldvalues.sanitize`) goes to ``NAME=_other`` (counted as
``unsafe``), and so does a missing one (``missing``); nothing is percent-encoded.
:class:`~tfrecordd.outputs.partitioncap.PartitionCap` caps the number of distinct combinations of
field values.
"""

from __future__ import annotations

import contextlib
import math
import re
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from itertools import repeat

from tfrecordd.datasets import PartitionSection
from tfrecordd.errors import ConfigError, EncodeError
from tfrecordd.format.features import FeatureReader, FeatureValue, Row, hour_groups
from tfrecordd.format.wire import FeatureType
from tfrecordd.outputs.fieldvalues import OTHER, float32_short, sanitize
from tfrecordd.schema.numtext import PER_SECOND, parse_rfc3339
from tfrecordd.schema.specs import FeatureSpec

__all__ = [
    "OTHER",
    "Assigned",
    "Partitioner",
    "TimeRange",
    "folder_range",
    "time_folder",
    "time_prefix",
]

_HOUR, _DAY = 3600, 86400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MAX_ORDINAL = date.max.toordinal()
_LO, _HI = -62135596800, 253402300800
"""0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z: event times must lie in between."""
_SAMPLE_LO, _SAMPLE_HI = _LO + _DAY, _HI - _DAY
"""Offsets are looked up within these (any zone's local time is a ``datetime`` there), and
taken as constant beyond."""
_SCAN = _HOUR
"""The step at which offsets are sampled to find their changes (then bisected to the second):
no zone changes its offset and back within an hour."""
_TIME = re.compile(r"dt=(\d{4})-(\d{2})-(\d{2})(?:/hour=(\d{2}))?([+-]\d{4}(?:\d{2})?)?", re.ASCII)
_KINDS = {int: "int64", float: "float", bytes: "bytes"}
_CACHE_HOURS = 1 << 14
_CACHE_VALUES = 1 << 12
_NANOS = 10**9


@dataclass(frozen=True)
class TimeRange:
    """The instants a time folder holds: ``[start, end)`` in epoch seconds, and both ends as
    ISO 8601 local times with their UTC offsets (``2026-10-25T02:00:00+01:00``)."""

    start: float
    end: float
    start_local: str
    end_local: str


@dataclass(slots=True)
class Assigned:
    """Where one batch's records go (:meth:`Partitioner.assign`)."""

    groups: dict[str, list[int]] = field(default_factory=dict)
    """Folder (``""`` when unpartitioned) → indexes of its records, ascending."""
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Folder → ``(min, max)`` time of its records in epoch seconds: event times, or the
    arrival time; empty when ``time = "none"``."""
    refused: dict[int, str] = field(default_factory=dict)
    """Index → why the record's event time cannot place it (dead-lettered as ``event-time``)."""
    fallbacks: dict[str, int] = field(default_factory=dict)
    """Reason (``unsafe``, ``missing``) → how many field values went to ``_other``."""


def _offset_text(offset: int) -> str:
    sign = "-" if offset < 0 else "+"
    h, rest = divmod(abs(offset), _HOUR)
    m, s = divmod(rest, 60)
    return f"{sign}{h:02d}{m:02d}" + (f"{s:02d}" if s else "")


def _date_text(days: int) -> str:
    ordinal = days + _EPOCH_ORDINAL
    if ordinal == _MAX_ORDINAL + 1:  # the end of the last folder of year 9999
        return "10000-01-01"
    return date.fromordinal(ordinal).isoformat()


class _Clock:
    """The time folders of one zone and granularity."""

    def __init__(self, zone: str, hourly: bool) -> None:
        self._zone = zoneinfo.ZoneInfo(zone)
        self.hourly = hourly
        self._span = _HOUR if hourly else _DAY
        self.hours: dict[int, str | list[tuple[int, str]]] = {}
        """UTC hour → its folder, or ``(end, folder)`` of each of its parts (the cache)."""

    def offset(self, t: int) -> int:
        """The zone's UTC offset at ``t``, in seconds."""
        utc = _EPOCH + timedelta(seconds=min(max(t, _SAMPLE_LO), _SAMPLE_HI))
        delta = utc.astimezone(self._zone).utcoffset()
        assert delta is not None
        return delta.days * _DAY + delta.seconds

    def _segments(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """``(start, offset)`` of each stretch of one offset in ``[lo, hi)``, the first at lo."""
        out = [(lo, self.offset(lo))]
        t = lo
        while t < hi:
            u = min(t + _SCAN, hi)
            if self.offset(u) == out[-1][1]:
                t = u
                continue
            before = out[-1][1]
            while u - t > 1:
                mid = (t + u) // 2
                if self.offset(mid) == before:
                    t = mid
                else:
                    u = mid
            out.append((u, self.offset(u)))
            t = u
        return out

    def runs(self, label: int) -> list[tuple[int, int, str]]:
        """``(start, end, suffix)`` of each folder whose local date (and hour) starts at local
        seconds ``label``, in time order: the first has no suffix, the others their offset."""
        lo, hi = label - _DAY, label + self._span + _DAY
        segments = self._segments(lo, hi)
        runs: list[list[int]] = []  # start, end, offset at start, offset at end
        for k, (start, offset) in enumerate(segments):
            stop = segments[k + 1][0] if k + 1 < len(segments) else hi
            begin, end = max(start, label - offset), min(stop, label + self._span - offset)
            if begin >= end:
                continue
            # Clocks going forward continue a folder; going back starts a new hour.
            if runs and runs[-1][1] == begin and (not self.hourly or offset > runs[-1][3]):
                runs[-1][1], runs[-1][3] = end, offset
            else:
                runs.append([begin, end, offset, offset])
        return [(s, e, _offset_text(o) if n else "") for n, (s, e, o, _) in enumerate(runs)]

    def label_text(self, label: int) -> str:
        """``dt=…`` (and ``/hour=…``) of local seconds ``label``."""
        days, seconds = divmod(label, _DAY)
        if not 1 <= days + _EPOCH_ORDINAL <= _MAX_ORDINAL:
            raise ValueError("outside years 1 to 9999 in the zone")
        text = "dt=" + _date_text(days)
        return f"{text}/hour={seconds // _HOUR:02d}" if self.hourly else text

    def locate(self, t: int) -> tuple[str, int, int]:
        """The folder of instant ``t`` (whole seconds) and its ``[start, end)``."""
        if not _LO <= t < _HI:
            raise ValueError("outside years 1 to 9999")
        local = t + self.offset(t)
        label = local - local % self._span
        text = self.label_text(label)
        for start, end, suffix in self.runs(label):
            if start <= t < end:
                return text + suffix, start, end
        raise AssertionError(f"no folder holds {t}")

    def folder(self, t: int) -> str:
        """:meth:`locate`'s folder, cached by UTC hour (the hot path)."""
        hour = t // _HOUR
        entry = self.hours.get(hour)
        if entry is None:
            entry = self._fill(hour)
            if entry is None:
                return self.locate(t)[0]
        if isinstance(entry, str):
            return entry
        for end, name in entry:
            if t < end:
                return name
        raise AssertionError(f"no folder holds {t}")

    def _fill(self, hour: int) -> str | list[tuple[int, str]] | None:
        """The folders of UTC hour ``hour``, or ``None`` at the edge of the years (not cached:
        each instant there is located alone)."""
        parts: list[tuple[int, str]] = []
        t, stop = hour * _HOUR, (hour + 1) * _HOUR
        try:
            while t < stop:
                name, _, t = self.locate(t)
                parts.append((t, name))
        except ValueError:
            return None
        entry: str | list[tuple[int, str]] = parts[0][1] if len(parts) == 1 else parts
        if len(self.hours) >= _CACHE_HOURS:
            self.hours.clear()
        self.hours[hour] = entry
        return entry

    def iso(self, t: int) -> str:
        """Instant ``t`` as ISO 8601 local time with its offset."""
        offset = self.offset(t)
        days, seconds = divmod(t + offset, _DAY)
        h, rest = divmod(seconds, _HOUR)
        zone = _offset_text(offset)
        zone = f"{zone[:3]}:{zone[3:5]}" + (f":{zone[5:]}" if len(zone) > 5 else "")
        return f"{_date_text(days)}T{h:02d}:{rest // 60:02d}:{rest % 60:02d}{zone}"


_clock = lru_cache(maxsize=64)(_Clock)


def _clock_of(spec: PartitionSection) -> _Clock:
    return _clock(spec.zone, spec.granularity == "hour")  # one per zone and granularity


def time_folder(spec: PartitionSection, t: float) -> str:
    """The time folder (``dt=YYYY-MM-DD/hour=HH``, or ``dt=YYYY-MM-DD``) of instant ``t``
    (epoch seconds) in ``spec.zone``. Raises ``ValueError`` for a time that is not finite or
    is outside years 1 to 9999 (in UTC or in the zone)."""
    if not math.isfinite(t):
        raise ValueError(f"not a time: {t}")
    return _clock_of(spec).folder(math.floor(t))


def time_prefix(spec: PartitionSection, folder: str) -> str:
    """The time segments of ``folder`` (``dt=…`` and, by the hour, ``/hour=…``), or ``""``
    when it has none (``time = "none"``, or not a folder of ``spec``'s layout)."""
    if spec.time == "none":
        return ""
    hourly = spec.granularity == "hour"
    prefix = "/".join(folder.split("/", 2)[: 2 if hourly else 1])
    match = _TIME.fullmatch(prefix)
    return prefix if match and (match.group(4) is not None) == hourly else ""


def folder_range(spec: PartitionSection, folder: str) -> TimeRange | None:
    """The instants that :func:`time_folder` maps to ``folder`` (or to its time prefix):
    exactly those in the returned ``[start, end)``. ``None`` when ``folder`` is not a time
    folder of ``spec``'s layout, or names one that never occurs (the hour skipped when clocks
    go forward, an offset suffix the zone does not have there)."""
    match = _TIME.fullmatch(time_prefix(spec, folder))
    if match is None:
        return None
    year, month, day, hour, suffix = match.groups()
    try:
        days = date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None
    if hour is not None and int(hour) > 23:
        return None
    clock = _clock_of(spec)
    label = days * _DAY + int(hour or 0) * _HOUR
    for start, end, run_suffix in clock.runs(label):
        if run_suffix == (suffix or ""):
            return TimeRange(float(start), float(end), clock.iso(start), clock.iso(end))
    return None


def _first_index(item: tuple[str, list[int]]) -> int:
    return min(item[1])


class Partitioner:
    """The folders of a dataset's records (module docstring: the layout and its rules).

    Built once per dataset from its partition section and its schema's features; raises
    :class:`~tfrecordd.errors.ConfigError` when ``time_field`` or a field is not a feature, or
    the time field is neither ``int64`` with ``time_unit`` nor ``bytes``.
    """

    def __init__(self, spec: PartitionSection, features: Mapping[str, FeatureSpec]) -> None:
        self.spec = spec
        errors: list[str] = []
        names = [spec.time_field, *spec.fields] if spec.time_field else list(spec.fields)
        self._per_second, self._unit = 0, ""
        """Units per second of an int64 time, and the unit; 0 and "" for RFC 3339 text."""
        if spec.time_field:
            feature = features.get(spec.time_field)
            if feature is None:
                errors.append(f"partition.time_field: no feature {spec.time_field!r}")
            elif feature.type is FeatureType.INT64 and feature.time_unit is not None:
                self._per_second, self._unit = PER_SECOND[feature.time_unit], feature.time_unit
            elif feature.type is not FeatureType.BYTES:
                errors.append(
                    f"partition.time_field: {spec.time_field!r} must be an int64 feature with "
                    "time_unit, or a bytes feature of RFC 3339 text"
                )
        errors += [f"partition.fields: no feature {n!r}" for n in spec.fields if n not in features]
        if errors:
            raise ConfigError(errors)
        self._reader = FeatureReader(names) if names else None
        self._clock = _clock_of(spec) if spec.time != "none" else None
        self._texts: list[dict[int | bytes, tuple[str, str | None]]] = [{} for _ in spec.fields]

    def assign(
        self, records: Sequence[bytes], arrival: float, times: bytes | None = None
    ) -> Assigned:
        """Each record's folder. ``arrival``: when the batch was read (epoch seconds), the time
        of every record for ``time = "arrival"``. ``times``: the first value of each record's
        int64 ``time_field`` where the encoder noted it as it wrote the record (native
        ``int64``s, the lowest one where it did not), read from the records otherwise."""
        out = Assigned()
        if not records:
            return out
        if self._reader is None and self._clock is None:
            out.groups[""] = list(range(len(records)))
            return out
        event = self.spec.time == "event"
        width, skip, per_second = len(self.spec.fields), int(event), self._per_second
        base = time_folder(self.spec, arrival) if self.spec.time == "arrival" else ""
        hours = self._clock.hours if self._clock is not None else {}
        groups, fallbacks = out.groups, out.fallbacks
        spans: dict[str, list[float]] = {}
        indexes: Sequence[int] = range(len(records))
        unsorted = False
        if event and per_second and not width:
            indexes, unsorted = self._by_hour(records, groups, spans, times)
        rows: Iterable[Row | None] = repeat(None)
        if self._reader is not None and indexes:
            some = records if len(indexes) == len(records) else [records[i] for i in indexes]
            rows = self._reader.read_batch(some)
        t = 0.0
        for i, row in zip(indexes, rows, strict=False):
            folder = base
            if event:
                value = row[0] if row is not None else None
                # The hot path: an int64 time whose UTC hour lies in one folder already seen.
                if (
                    per_second
                    and type(value) is int
                    and type(cached := hours.get(value // per_second // _HOUR)) is str
                ):
                    folder, t = cached, value / per_second
                else:
                    placed = self._event(row)
                    if isinstance(placed, str):
                        out.refused[i] = placed
                        continue
                    folder, t = placed
            if width:
                parts = [folder] if folder else []
                for j in range(width):
                    text, reason = self._field(j, row[skip + j] if row is not None else None)
                    parts.append(text)
                    if reason is not None:
                        fallbacks[reason] = fallbacks.get(reason, 0) + 1
                folder = "/".join(parts)
            group = groups.get(folder)
            if group is None:
                groups[folder], spans[folder] = [i], [t, t]
                continue
            group.append(i)
            span = spans[folder]
            if t < span[0]:
                span[0] = t
            elif t > span[1]:
                span[1] = t
        if unsorted:
            # Records placed in C and here: each folder's indexes, and the folders, in order.
            out.groups = {f: sorted(g) for f, g in sorted(groups.items(), key=_first_index)}
        if event:
            out.times = {folder: (span[0], span[1]) for folder, span in spans.items()}
        elif base:
            out.times = dict.fromkeys(groups, (arrival, arrival))
        return out

    def _by_hour(
        self,
        records: Sequence[bytes],
        groups: dict[str, list[int]],
        spans: dict[str, list[float]],
        times: bytes | None = None,
    ) -> tuple[Sequence[int], bool]:
        """Place in ``groups`` (with their ``spans``) the records whose int64 time lies in a UTC
        hour of one folder, grouped by hour in C (:func:`hour_groups`); the indexes of the rest,
        for the record-by-record path (all of them where the extension is not built), and
        whether any folder's indexes are out of order."""
        assert self._clock is not None
        assert self.spec.time_field is not None
        by_hour = hour_groups(records, self.spec.time_field, self._per_second, times)
        if by_hour is None:
            return range(len(records)), False
        found, rest = by_hour
        per_second, hours, mixed = self._per_second, self._clock.hours, False
        for hour, indexes, low, high in found:
            if hour not in hours:
                with contextlib.suppress(ValueError):  # outside years 1 to 9999: refused below
                    self._clock.folder(low // per_second)
            folder = hours.get(hour)
            if type(folder) is not str:  # an hour split between two folders
                rest.extend(indexes)
                mixed = True
            elif (group := groups.get(folder)) is None:
                groups[folder], spans[folder] = indexes, [low / per_second, high / per_second]
            else:  # another hour of the same folder (granularity = "day")
                group.extend(indexes)
                span, mixed = spans[folder], True
                span[:] = min(span[0], low / per_second), max(span[1], high / per_second)
        return (sorted(rest) if mixed else rest), mixed or bool(rest and groups)

    def _event(self, row: Row | None) -> tuple[str, float] | str:
        """The time folder and event time of a record, or why it has none."""
        name, per_second = self.spec.time_field, self._per_second or _NANOS
        value = row[0] if row is not None else None
        if row is None:
            return f"not a well-formed Example: its event time feature {name!r} cannot be read"
        if value is None:
            return f"event time feature {name!r} is missing or empty"
        if self._per_second and not isinstance(value, int):
            return f"event time feature {name!r} holds {_KINDS[type(value)]} values, not int64"
        if not self._per_second:
            if not isinstance(value, bytes):
                return f"event time feature {name!r} holds {_KINDS[type(value)]}, not RFC 3339 text"
            try:
                value = parse_rfc3339(value.decode(), _NANOS)
            except UnicodeDecodeError:
                return f"event time feature {name!r} is not UTF-8 text"
            except EncodeError as e:
                return f"event time feature {name!r}: {e.reason}"
        assert isinstance(value, int)
        assert self._clock is not None
        try:
            return self._clock.folder(value // per_second), value / per_second
        except ValueError:
            unit = self._unit or "ns"
            return f"event time {value} {unit} is outside years 1 to 9999 (UTC or {self.spec.zone})"

    def _field(self, j: int, value: FeatureValue | None) -> tuple[str, str | None]:
        """``NAME=value`` of field ``j``, and the fallback's reason if it is ``NAME=_other``."""
        name = self.spec.fields[j]
        if value is None:
            return f"{name}={OTHER}", "missing"
        if isinstance(value, float):
            text = sanitize(float32_short(value))
            return (f"{name}={text}", None) if text else (f"{name}={OTHER}", "unsafe")
        cache = self._texts[j]
        hit = cache.get(value)
        if hit is None:
            text = sanitize(value)
            hit = (f"{name}={text}", None) if text else (f"{name}={OTHER}", "unsafe")
            if len(cache) >= _CACHE_VALUES:
                cache.clear()
            cache[value] = hit
        return hit
