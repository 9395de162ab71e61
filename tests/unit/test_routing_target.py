"""A routed source feeding a partitioned dataset: every event of a batch (sent as events or as
lines, in any mix) is written to its dataset and hour once, in order, or fails once with the
reason that is its own, whatever failed before it in the batch."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.config import parse_config
from tfrecordd.events import FailureReason, Lines, RawEvent
from tfrecordd.format.features import FeatureReader
from tfrecordd.format.writer import Packed, unpack
from tfrecordd.outputs import partitions
from tfrecordd.pipeline import routing
from tfrecordd.pipeline.encodeplan import plan_encoding
from tfrecordd.pipeline.encoding import EncodeRequest, Part
from tfrecordd.pipeline.routing import Target, encode_with
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
[encoders.e]
type = "example"
[encoders.e.features]
id = "int64"
kind = "bytes"
ts = { type = "int64", time_unit = "ms", required = false }
"""


# What each event is: written to "hours" in hour N, written to "flat", or failing for a reason.
KINDS = st.one_of(
    st.tuples(st.just("hour"), st.integers(0, 3)),
    st.just(("flat", 0)),
    st.just(("unrouted", 0)),
    st.just(("schema", 0)),
    st.just(("no-time", 0)),
)


def _target() -> Target:
    config = parse_config(tomllib.loads(CONFIG), Registry.from_entry_points())
    plan = plan_encoding(config)
    built = plan.builders[plan.sources["s"].target].build()
    assert isinstance(built, Target)
    return built


TARGET = _target()


ESCAPED: set[int] = set()
"""Events whose route value is written with escapes (read in Python, not in C)."""


def _payload(i: int, kind: str, hour: int) -> bytes:
    event: dict[str, Any] = {"id": i, "kind": "f" if kind == "flat" else "h"}
    if kind == "unrouted":
        event["kind"] = "other"
    if kind == "schema":
        event["id"] = "not a number"
    if kind != "no-time":
        event["ts"] = hour * 3600 + i  # whole seconds, stored as milliseconds
    text = json.dumps(event)
    if i in ESCAPED:
        value = event["kind"]
        escaped = "".join(f"\\u{ord(c):04x}" for c in value)
        text = text.replace(f'"kind": "{value}"', f'"kind": "{escaped}"')
    return text.encode()


def _ids(records: list[bytes] | Packed) -> list[int]:
    items = unpack(records) if isinstance(records, Packed) else records
    rows = FeatureReader(["id"]).read_batch(items)
    return [row[0] for row in rows]  # type: ignore[index,misc]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(KINDS, max_size=40),
    st.lists(KINDS, max_size=40),
    st.sets(st.integers(0, 79)),
    st.booleans(),
)
def test_every_event_is_written_or_failed_once_with_its_own_reason(
    as_events: list[tuple[str, int]],
    as_lines: list[tuple[str, int]],
    escaped: set[int],
    compiled: bool,
) -> None:
    """The same whether the route's values and the event times are grouped in C or read in
    Python (``compiled``), and whatever mix of the two a batch needs (``escaped``)."""
    ESCAPED.clear()
    ESCAPED.update(escaped)
    with pytest.MonkeyPatch.context() as patch:
        if not compiled:
            patch.setattr(routing, "string_groups", lambda *_, **__: None)
            patch.setattr(partitions, "hour_groups", lambda *_: None)
        check_every_event(as_events, as_lines)


def check_every_event(as_events: list[tuple[str, int]], as_lines: list[tuple[str, int]]) -> None:
    events = [RawEvent(_payload(i, k, h), f"e{i}") for i, (k, h) in enumerate(as_events)]
    base = len(as_events)
    text = b"".join(_payload(base + j, k, h) + b"\n" for j, (k, h) in enumerate(as_lines))
    lines = Lines(text, "lines.jsonl", 0, 1 << 20) if text else None
    request = EncodeRequest("@s", events, lines, TARGET.config.datasets["hours"].compression, None)
    outcome = encode_with(TARGET, request)

    kinds = [*as_events, *as_lines]
    failed: dict[int, FailureReason] = {}
    for f in outcome.failures:
        assert f.at not in failed
        failed[f.at] = f.reason
    for ev, reason, _ in outcome.line_failures:
        i = json.loads(ev.payload)["id"] if reason is not FailureReason.SCHEMA else None
        if i is None:
            i = base + [_payload(base + j, k, h) for j, (k, h) in enumerate(as_lines)].index(
                ev.payload
            )
        assert i not in failed
        failed[i] = reason
    expected_failures = {
        i: {
            "unrouted": FailureReason.ROUTE,
            "schema": FailureReason.SCHEMA,
            "no-time": FailureReason.EVENT_TIME,
        }[k]
        for i, (k, _) in enumerate(kinds)
        if k in ("unrouted", "schema", "no-time")
    }
    assert failed == expected_failures

    parts: list[Part] = outcome.parts or []
    written = {(p.dataset, p.folder): _ids(p.records) for p in parts}
    expected: dict[tuple[str, str], list[int]] = {}
    for i, (k, h) in enumerate(kinds):
        if k == "hour":
            expected.setdefault(("hours", f"dt=1970-01-01/hour={h:02d}"), []).append(i)
        elif k == "flat":
            expected.setdefault(("flat", ""), []).append(i)
    # Events sent as events come before those of the lines, each in order.
    assert written == expected
    assert outcome.line_events == len(as_lines)
