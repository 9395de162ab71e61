"""A route read in the encoder's own parse: where every dataset of a routed source shares one
encoder with a compiled JSON plan, a batch's lines are encoded once, and the plan notes each
line's route value (and the int64 event time a partitioned dataset files it by) as it parses
it (:meth:`ExamplePlan.encode_routed <tfrecordd._cexample.ExamplePlan.encode_routed>`), where a
:class:`~tfrecordd.pipeline.routing.Target` would otherwise scan every line for the value first,
and read every record's time after.

The records are those the shared encoder writes, and each goes where the scan would send it:
the plan groups a line by its value only where that value is a plain string (no escapes, the
key not repeated); any other line, and any line the plan leaves to Python, is routed and
encoded as :class:`~tfrecordd.pipeline.routing.Target` does it, and comes back in its place.
A time the plan did not note (none, or not where it looked) is read from the record.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfrecordd.datasets import RouteSection
from tfrecordd.events import FailureReason, RawEvent, not_json
from tfrecordd.pipeline.encoding import EventFailure, guarded
from tfrecordd.plugin import Encoder

__all__ = ["FusedRoute", "Routed", "fused_route"]

_UNKNOWN = -(1 << 63)
"""A time the plan did not note: the record is read (``time_groups``)."""


@dataclass(slots=True)
class Routed:
    """One dataset's share of a batch's lines: its records in line order, the line each came
    from, and each record's event time as the plan noted it (``int64``s, :data:`_UNKNOWN`
    where it did not; ``None``: no time noted)."""

    records: list[bytes]
    lines: list[int]
    times: bytes | None

    def origins(self) -> list[int]:
        """Where each record came from, as a target's parts name it: ``-1 - j`` for line
        ``j``."""
        return [-1 - j for j in self.lines]


class FusedRoute:
    """Encodes and routes a batch's lines in one parse (see the module's docstring)."""

    def __init__(self, encoder: Encoder, plan: Any, route: RouteSection, time: str | None) -> None:
        self.encoder = encoder
        self.plan = plan
        self.route = route
        self.time = time
        """The int64 feature whose first value the plan notes (the partitions' event time)."""
        self._key = route.field.encode()
        self._texts = list(route.to)
        self._values = tuple(v.encode() for v in self._texts)

    def groups(
        self,
        payloads: list[bytes],
        read: Callable[[bytes], str | None],
        line_failures: list[EventFailure],
        line_event: Callable[[int], RawEvent],
        no_route: Callable[[str | None], str],
    ) -> dict[str, Routed]:
        """Each dataset's records of ``payloads`` (lines), in order of first appearance.
        ``read`` reads a line's route value the Python way (``ValueError``: not JSON); the lines
        that reach no dataset, or that the encoder refuses, join ``line_failures``."""
        route = self.route
        time = None if self.time is None else self.time.encode()
        groups, rest = self.plan.encode_routed(payloads, self._key, self._values, time)
        out: dict[str, list[Routed]] = {}
        unrouted: list[tuple[int, EventFailure]] = []
        encoding: list[EventFailure] = []
        k = len(self._texts)
        for c, (lines, records, times) in enumerate(groups):
            if not lines:
                continue
            name = route.to[self._texts[c]] if c < k else route.default
            if name is None:
                self._unrouted(lines, payloads, read, unrouted, line_event, no_route)
                continue
            out.setdefault(name, []).append(Routed(records, lines, times))
        if rest:
            self._python(rest, payloads, read, (unrouted, encoding), line_event, no_route, out)
        # As the scan's path gives them: the lines that reach no dataset in order, then those
        # their encoder refused.
        line_failures.extend(f for _, f in sorted(unrouted, key=lambda u: u[0]))
        line_failures.extend(encoding)
        merged = {name: _merged(shares) for name, shares in out.items()}
        return dict(sorted(merged.items(), key=lambda item: item[1].lines[0]))

    def _unrouted(
        self,
        lines: Sequence[int],
        payloads: Sequence[bytes],
        read: Callable[[bytes], str | None],
        unrouted: list[tuple[int, EventFailure]],
        line_event: Callable[[int], RawEvent],
        no_route: Callable[[str | None], str],
    ) -> None:
        for j in lines:
            try:
                failure = (FailureReason.ROUTE, no_route(read(payloads[j])))
            except ValueError as e:
                failure = (FailureReason.MALFORMED, not_json(e))
            unrouted.append((j, (line_event(j), *failure)))

    def _python(
        self,
        rest: Sequence[int],
        payloads: Sequence[bytes],
        read: Callable[[bytes], str | None],
        failures: tuple[list[tuple[int, EventFailure]], list[EventFailure]],
        line_event: Callable[[int], RawEvent],
        no_route: Callable[[str | None], str],
        out: dict[str, list[Routed]],
    ) -> None:
        """The lines the plan left: routed and encoded as the scan's path does it.
        ``failures``: where the lines that reach no dataset go (with their index), and where
        those the encoder refuses go."""
        route = self.route
        unrouted, encoding = failures
        by_name: dict[str | None, list[int]] = {}
        for j in rest:
            try:
                text = read(payloads[j])
            except ValueError as e:
                unrouted.append((j, (line_event(j), FailureReason.MALFORMED, not_json(e))))
                continue
            name = route.default if text is None else route.to.get(text, route.default)
            by_name.setdefault(name, []).append(j)
        for name, lines in by_name.items():
            if name is None:
                self._unrouted(lines, payloads, read, unrouted, line_event, no_route)
                continue
            result = guarded(self.encoder.encode_lines, [payloads[j] for j in lines])
            failed = {f.at for f in result.failures}
            for f in result.failures:
                encoding.append((line_event(lines[f.at]), f.reason, f.detail))
            kept = [j for i, j in enumerate(lines) if i not in failed]
            if kept:
                times = None if self.time is None else array("q", [_UNKNOWN] * len(kept)).tobytes()
                out.setdefault(name, []).append(Routed(result.records, kept, times))


def _merged(shares: list[Routed]) -> Routed:
    """One dataset's shares as one, in line order."""
    if len(shares) == 1:
        return shares[0]
    rows: list[tuple[int, bytes, int]] = []
    timed = all(s.times is not None for s in shares)
    for s in shares:
        times: Sequence[int] = (
            array("q", s.times) if s.times is not None else [_UNKNOWN] * len(s.lines)
        )
        rows.extend(zip(s.lines, s.records, times, strict=True))
    rows.sort(key=lambda row: row[0])
    return Routed(
        [r for _, r, _ in rows],
        [j for j, _, _ in rows],
        array("q", [t for _, _, t in rows]).tobytes() if timed else None,
    )


def fused_route(
    encoders: Mapping[str, Encoder],
    configs: Sequence[object],
    route: RouteSection | None,
    times: Sequence[str | None],
) -> FusedRoute | None:
    """The fused route of a target, where it may have one: a route, one encoder config for
    every dataset, and that encoder's compiled plan able to note the route's value. ``times``:
    the int64 time feature of each partitioned dataset (``None`` for one that reads no int64
    time); the plan notes it where they all agree."""
    if route is None or not encoders or any(c != configs[0] for c in configs):
        return None
    encoder = next(iter(encoders.values()))
    plan = getattr(encoder, "plan", None)
    if plan is None or not hasattr(plan, "encode_routed") or len(route.to) > 250:
        return None
    wanted = set(times)
    time = wanted.pop() if len(wanted) == 1 else None
    return FusedRoute(encoder, plan, route, time)
