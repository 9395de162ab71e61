"""Events to datasets and partition folders: what the encode stage does for a source that routes
its events by a field, or that feeds a partitioned dataset.

A source feeding one dataset without partitions is encoded as it always was: one encoder, one
list of records (:func:`~tfrecordd.pipeline.encoding.encode`). Any other source has a
:class:`TargetConfig`, built into a :class:`Target` once in each process that encodes (the
daemon's encode thread, each worker process). :meth:`Target.encode` picks each event's dataset
(the value of the route's field: a JSON object's key, a CSV column, a whole file's attribute),
encodes each dataset's events with its encoder, and splits each dataset's records by partition
folder: one :class:`~tfrecordd.pipeline.encoding.Part` per (dataset, folder), records in their
order. An event whose value names no dataset (and no ``default``) fails with the reason
``route``; one whose record holds no readable event time, with ``event-time``.

The route's field is read from each JSON event besides the encoder's own parse: a batch's events
are grouped by its value in one pass in C (:func:`~tfrecordd.schema.string_groups`) where the
value is a plain string, the rest parsed in Python; the price of routing, paid in the encode
workers, in parallel. Where every dataset's encoder parses its payloads whole
(:attr:`~tfrecordd.plugin.Encoder.parses_json`), that pass skips the rest of each event without
checking it (``lax``), and an event that is not JSON fails as ``malformed`` wherever it goes:
in its encoder, or here when it reaches no dataset (:meth:`Target._groups`). Where the route's
datasets share one encoder with a compiled plan, a batch's lines skip that pass: the plan notes
each line's value as it encodes it (:mod:`~tfrecordd.pipeline.fused`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfrecordd.datasets import PartitionSection, RouteSection
from tfrecordd.events import EncodeResult, FailureReason, RawEvent, not_json
from tfrecordd.format.compress import Unit
from tfrecordd.format.compression import Compression
from tfrecordd.format.framing import frame_groups
from tfrecordd.format.writer import Packed, frame
from tfrecordd.outputs.partitions import Partitioner
from tfrecordd.pipeline.encoding import (
    EncodeRequest,
    EventFailure,
    Outcome,
    Part,
    encode,
    guarded,
    packed,
    packed_framed,
)
from tfrecordd.pipeline.fused import Routed, fused_route
from tfrecordd.plugin import Encoder, EncoderConfig, Failure
from tfrecordd.schema import FeatureSpec, string_groups
from tfrecordd.schema.json_values import load_event

log = logging.getLogger("tfrecordd")

__all__ = [
    "DatasetPlan",
    "Target",
    "TargetConfig",
    "encode_with",
    "route_value",
]


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    """How one dataset's records are made: its encoder, its shards' compression (records large
    enough are compressed where they are encoded), and its partitioning with the schema's
    features it reads."""

    encoder: EncoderConfig
    compression: Compression = Compression.NONE
    level: int | None = None
    partition: PartitionSection = field(default_factory=PartitionSection)
    features: Mapping[str, FeatureSpec] = field(default_factory=dict)
    max_records: int = 0
    """The dataset's ``max_shard_records`` (``0``: none): no joined unit holds more."""
    max_bytes: int = 0
    """The dataset's ``max_shard_bytes`` (``0``: none): no joined unit may take more than a
    quarter of it, as no batch does (``max_batch_bytes``)."""


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Where a source's events go (picklable: worker processes are given it at start-up)."""

    datasets: Mapping[str, DatasetPlan]
    """Every dataset the source may feed."""
    dataset: str | None = None
    """The dataset of every event, for a source without a route."""
    route: RouteSection | None = None

    def build(self) -> Target:
        """The target, with its encoders and partitioners built."""
        return Target(self)


def _text(value: Any) -> str | None:
    """A route value as text, ``None`` where it is no scalar (a number past a double's range is
    its text, as JSON wrote it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # A number read again from its text (past what orjson reads) keeps that text.
        text = getattr(value, "text", None)
        return text if isinstance(text, str) else repr(value)
    return None


def route_value(event: RawEvent, field_name: str) -> str | None:
    """The value of ``field_name`` in ``event`` as text: from its structured value (a CSV row,
    a file's attributes) where it has one, else from its payload parsed as a JSON object;
    ``None`` when missing, not a scalar, or the payload is not a JSON object."""
    value = event.value
    if isinstance(value, Mapping):
        return _text(value.get(field_name))
    if event.format is not None:
        return None
    return _payload_value(event.payload, field_name)


def _payload_value(payload: bytes, field_name: str) -> str | None:
    try:
        return _json_value(payload, field_name)
    except ValueError:
        return None


def _json_value(payload: bytes, field_name: str) -> str | None:
    """:func:`_payload_value`, but raising ``orjson.JSONDecodeError`` for a payload that is not
    JSON."""
    try:
        parsed, _ = load_event(payload)
    except orjson.JSONDecodeError:
        raise
    except ValueError:
        return None
    return _text(parsed.get(field_name)) if isinstance(parsed, dict) else None


@dataclass(slots=True)
class _Group:
    """One dataset's share of a request: event indexes and line indexes, in order."""

    events: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


class Target:
    """Encodes requests of one source into parts (see the module's docstring)."""

    def __init__(self, config: TargetConfig) -> None:
        self.config = config
        self.encoders: dict[str, Encoder] = {
            n: p.encoder.build() for n, p in config.datasets.items()
        }
        self.partitioners: dict[str, Partitioner] = {
            n: Partitioner(p.partition, p.features)
            for n, p in config.datasets.items()
            if p.partition.partitioned
        }
        self.lax = all(e.parses_json for e in self.encoders.values())
        """Whether every dataset's encoder parses its JSON payloads whole: the route then reads
        its field without checking the rest (the encoder does), and a payload that is not JSON
        fails as ``malformed`` wherever it would have gone (see :meth:`_groups`)."""
        self.fused = (
            fused_route(
                self.encoders,
                [p.encoder for p in config.datasets.values()],
                config.route,
                [p.partition.time_field for p in config.datasets.values() if _int64_time(p)],
            )
            if self.lax
            else None
        )
        """The route read in the shared encoder's parse, where it can be (a batch's lines)."""

    def encode(self, request: EncodeRequest, *, pack: bool = True) -> Outcome:
        """Encode ``request``'s events (then its lines' events) into parts; with ``pack``
        false, framed only (for :func:`~tfrecordd.pipeline.joining.encode_all` to join)."""
        events = request.events
        payloads: list[bytes] = []
        refused: list[RawEvent] = []
        lines = request.lines
        if lines is not None:
            payloads, refused = lines.split()
        failures: list[Failure] = []
        line_failures: list[EventFailure] = [
            (ev, FailureReason.REJECTED, ev.error or "") for ev in refused
        ]
        offsets: list[int] | None = None

        def line_event(j: int) -> RawEvent:
            nonlocal offsets
            assert lines is not None
            if offsets is None:
                offsets = lines.offsets()
            return RawEvent(payloads[j], lines.at(offsets[j]))

        parts: list[Part] = []
        fallbacks: dict[tuple[str, str], int] = {}
        routed: dict[str, Routed] | None = None
        if self.fused is not None and not events and payloads:
            route = self.config.route
            assert route is not None
            try:
                routed = self.fused.groups(
                    payloads,
                    lambda payload: _json_value(payload, route.field),
                    line_failures,
                    line_event,
                    lambda value: _no_route(route.field, value),
                )
            except MemoryError:  # the plan could not allocate: the scan's path, in Python
                log.warning("encoding a batch's %d lines: out of memory in C", len(payloads))
        if routed is not None:
            assert self.fused is not None
            for name, share in routed.items():
                times = share.times if self.fused.time == self._time_field(name) else None
                parts.extend(
                    self._parts(
                        name,
                        share.records,
                        share.origins,
                        request,
                        failures,
                        line_failures,
                        line_event,
                        fallbacks,
                        times,
                        pack,
                    )
                )
            lines_sent = len(payloads) + len(refused)
            return Outcome(frame([]), failures, line_failures, lines_sent, parts, fallbacks)
        groups = self._groups(events, payloads, failures, line_failures, line_event)
        for name, group in groups.items():
            records, origins = self._encode_group(
                name, group, events, payloads, failures, line_failures, line_event
            )
            parts.extend(
                self._parts(
                    name,
                    records,
                    origins,
                    request,
                    failures,
                    line_failures,
                    line_event,
                    fallbacks,
                    pack=pack,
                )
            )
        lines_sent = len(payloads) + len(refused)
        return Outcome(frame([]), failures, line_failures, lines_sent, parts, fallbacks)

    def _time_field(self, name: str) -> str | None:
        """The int64 time feature dataset ``name``'s partitions read, if any."""
        plan = self.config.datasets[name]
        return plan.partition.time_field if _int64_time(plan) else None

    def _groups(
        self,
        events: Sequence[RawEvent],
        payloads: Sequence[bytes],
        failures: list[Failure],
        line_failures: list[EventFailure],
        line_event: Callable[[int], RawEvent],
    ) -> dict[str, _Group]:
        groups: dict[str, _Group] = {}
        route = self.config.route
        if route is None:
            dataset = self.config.dataset
            assert dataset is not None
            return {dataset: _Group(list(range(len(events))), list(range(len(payloads))))}

        # With lax, a payload that is not JSON raises here (and fails as malformed, as it would
        # in any dataset's encoder), so that an event the C reader routed without checking it
        # and one Python reads fail alike.
        lax = self.lax

        def event_value(i: int) -> str | None:
            ev = events[i]
            if lax and ev.format is None and ev.value is None:
                return _json_value(ev.payload, route.field)
            return route_value(ev, route.field)

        def line_value(j: int) -> str | None:
            read = _json_value if lax else _payload_value
            return read(payloads[j], route.field)

        def unrouted(read: Callable[[int], str | None], at: int) -> tuple[FailureReason, str]:
            try:
                return FailureReason.ROUTE, _no_route(route.field, read(at))
            except ValueError as e:
                return FailureReason.MALFORMED, not_json(e)

        # Events with a structured value (a CSV row, a file's attributes) are read in Python,
        # and with lax any event with a value: its encoder may not parse its payload.
        json_payloads = [
            ev.payload if ev.format is None and _plain(ev.value, lax) else None for ev in events
        ]
        for name, indexes in self._by_dataset(json_payloads, event_value).items():
            if name is None:
                failures.extend(Failure(i, *unrouted(event_value, i)) for i in indexes)
            else:
                groups.setdefault(name, _Group()).events = indexes
        for name, indexes in self._by_dataset(payloads, line_value).items():
            if name is None:
                line_failures.extend((line_event(j), *unrouted(line_value, j)) for j in indexes)
            else:
                groups.setdefault(name, _Group()).lines = indexes
        return groups

    def _by_dataset(
        self, payloads: Sequence[bytes | None], read: Callable[[int], str | None]
    ) -> dict[str | None, list[int]]:
        """Each dataset the route gives the JSON ``payloads`` (``None``: none), with their
        indexes in order, datasets in order of first appearance: grouped in one pass in C
        (:func:`~tfrecordd.schema.string_groups`); ``read`` gives the value of each one the
        compiled reader is unsure of (and of each ``None`` in ``payloads``)."""
        route = self.config.route
        assert route is not None
        values = list(route.to)
        grouped = string_groups(payloads, route.field, values, lax=self.lax)
        if grouped is None:
            by_value: list[list[int]] = [[] for _ in values]
            other: list[int] = []
            unread: Sequence[int] = range(len(payloads))
        else:
            by_value, other, unread = grouped
        out: dict[str | None, list[int]] = {}
        for value, indexes in zip(values, by_value, strict=True):
            if indexes:
                out.setdefault(route.to[value], []).extend(indexes)
        if other:
            out.setdefault(route.default, []).extend(other)
        for j in unread:
            try:
                text = read(j)
            except ValueError:  # not JSON: fails as malformed, whatever the default
                out.setdefault(None, []).append(j)
                continue
            name = route.default if text is None else route.to.get(text, route.default)
            out.setdefault(name, []).append(j)
        if unread or other or len(out) < sum(map(bool, by_value)):
            # Indexes from more than one list: back in order.
            out = {name: sorted(indexes) for name, indexes in out.items()}
        return dict(sorted(out.items(), key=lambda item: item[1][0]))

    def _encode_group(
        self,
        name: str,
        group: _Group,
        events: Sequence[RawEvent],
        payloads: Sequence[bytes],
        failures: list[Failure],
        line_failures: list[EventFailure],
        line_event: Callable[[int], RawEvent],
    ) -> tuple[list[bytes], Callable[[], list[int]]]:
        """The dataset's records, and what gives, for each, where it came from: ``i`` for event
        ``i``, ``-1 - j`` for line ``j`` (asked for only when a record fails to be placed)."""
        encoder = self.encoders[name]
        records: list[bytes] = []
        failed_events: set[int] = set()
        failed_lines: set[int] = set()
        if group.events:
            result = guarded(encoder.encode_batch, [events[i] for i in group.events])
            failed_events = _failed(result)
            for f in result.failures:
                failures.append(Failure(group.events[f.at], f.reason, f.detail))
            records.extend(result.records)
        if group.lines:
            result = guarded(encoder.encode_lines, [payloads[j] for j in group.lines])
            failed_lines = _failed(result)
            for f in result.failures:
                line_failures.append((line_event(group.lines[f.at]), f.reason, f.detail))
            records.extend(result.records)

        def origins() -> list[int]:
            out = [i for k, i in enumerate(group.events) if k not in failed_events]
            return out + [-1 - j for k, j in enumerate(group.lines) if k not in failed_lines]

        return records, origins

    def _parts(
        self,
        name: str,
        records: list[bytes],
        origins_of: Callable[[], list[int]],
        request: EncodeRequest,
        failures: list[Failure],
        line_failures: list[EventFailure],
        line_event: Callable[[int], RawEvent],
        fallbacks: dict[tuple[str, str], int],
        times: bytes | None = None,
        pack: bool = True,
    ) -> list[Part]:
        if not records:
            return []
        partitioner = self.partitioners.get(name)
        plan = self.config.datasets[name]
        if partitioner is None:
            return [
                Part(
                    name,
                    "",
                    packed(records, plan.compression, plan.level) if pack else frame(records),
                )
            ]
        assigned = partitioner.assign(records, request.arrival, times)
        origins = origins_of() if assigned.refused else []
        for k, detail in assigned.refused.items():
            origin = origins[k]
            if origin >= 0:
                failures.append(Failure(origin, FailureReason.EVENT_TIME, detail))
            else:
                line_failures.append((line_event(-1 - origin), FailureReason.EVENT_TIME, detail))
        for reason, n in assigned.fallbacks.items():
            fallbacks[(name, reason)] = fallbacks.get((name, reason), 0) + n
        framed = frame_groups(records, list(assigned.groups.values()))
        return [
            Part(
                name,
                folder,
                packed_framed(data, lengths, plan.compression, plan.level)
                if pack
                else Packed(Unit(Compression.NONE, data, len(data)), lengths),
                assigned.times.get(folder),
            )
            for folder, (data, lengths) in zip(assigned.groups, framed, strict=True)
        ]


def _int64_time(plan: DatasetPlan) -> bool:
    """Whether a dataset's partitions read an int64 event time (one with a ``time_unit``)."""
    p = plan.partition
    spec = plan.features.get(p.time_field or "")
    return p.time == "event" and spec is not None and spec.type == "int64"


def _plain(value: Any, lax: bool) -> bool:
    """Whether an event with this value is routed by its payload in C."""
    return value is None or (not lax and not isinstance(value, Mapping))


def _failed(result: EncodeResult) -> set[int]:
    return {f.at for f in result.failures}


def _no_route(field_name: str, value: str | None) -> str:
    if value is None:
        return f"no routable value in field {field_name!r} (missing, or not a scalar)"
    return f"field {field_name!r} is {value!r}, which no route names (and there is no default)"


def encode_with(built: Encoder | Target, request: EncodeRequest) -> Outcome:
    """Encode ``request`` with what was built from its builder: a target's parts, or an
    encoder's records."""
    if isinstance(built, Target):
        return built.encode(request)
    return encode(request, built)
