"""A route whose datasets share one encoder is read in that encoder's own parse (the fused
route, :mod:`tfrecordd.pipeline.fused`), and the partitions' int64 event time noted there. Whatever
the lines (a value that is a plain string, escaped, repeated, missing, no string; a time that is
a number, missing, empty, a list, null, text, past any hour; lines that are not JSON), a batch's
outcome is the one the scan of every line and the read of every record give: the same records
in the same parts and folders (in the same order in each), with the same time spans, and the
same failures with the same reasons and details."""

from __future__ import annotations

import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd import speedups
from tfrecordd.config import parse_config
from tfrecordd.events import Lines
from tfrecordd.format.writer import unpack
from tfrecordd.pipeline.encodeplan import plan_encoding
from tfrecordd.pipeline.encoding import EncodeRequest, Outcome
from tfrecordd.pipeline.routing import Target, encode_with
from tfrecordd.plugin import Registry

CONFIG = """
[daemon]
state_dir = "/nonexistent/state"
[datasets.a]
encoder = "e"
dir = "/nonexistent/a"
partition = {{ time = "event", time_field = "ts", granularity = "hour", zone = "{zone}" }}
[datasets.b]
encoder = "{b}"
dir = "/nonexistent/b"
compression = "zlib"
{b_partition}
[[sources]]
name = "s"
type = "directory"
path = "/nonexistent/spool"
route = {{ field = "kind", to = {{ a = "a", b = "b", "7" = "b" }}{default} }}
[encoders.e]
type = "example"
[encoders.e.features]
id = "int64"
kind = "bytes"
ts = {{ type = "int64", time_unit = "ms" }}
[encoders.f]
type = "example"
[encoders.f.features]
id = "int64"
kind = "bytes"
ts = {{ type = "int64", time_unit = "ms" }}
other = "float"
"""

needs_compiled = pytest.mark.skipif(
    speedups.load("_cexample") is None, reason="the compiled plan is not built"
)


def _target(
    default: bool,
    zone: str = "UTC",
    b: str = "e",
    b_partitioned: bool = True,
    kind_feature: bool = True,
) -> Target:
    b_partition = (
        'partition = { time = "event", time_field = "ts", granularity = "day" }'
        if b_partitioned
        else ""
    )
    text = CONFIG.format(
        default=', default = "a"' if default else "", zone=zone, b=b, b_partition=b_partition
    )
    if not kind_feature:  # the route's field read where the plan skips a value
        text = text.replace('kind = "bytes"\n', "")
    config = parse_config(tomllib.loads(text), Registry.from_entry_points())
    plan = plan_encoding(config)
    built = plan.builders[plan.sources["s"].target].build()
    assert isinstance(built, Target)
    return built


KINDS = st.sampled_from(["a", "b", "c", "", "7", None, 7, ["a"], "escaped-a", "twice"])
TIMES = st.one_of(
    st.integers(-(10**12), 10**12),
    st.sampled_from([None, "missing", [], [1_700_000_000, 5], "2026-11-24T03:00:00Z", 1.5]),
    st.integers(-(2**63), 2**63 - 1),
)
BREAKS = st.sampled_from(["none", "none", "none", "truncate", "garbage", "tail"])
LINES = st.tuples(KINDS, TIMES, BREAKS, st.integers(0, 200))


def _line(i: int, kind: object, ts: object, how: str, at: int) -> bytes:
    event: dict[str, object] = {"id": i, "q": 'x"}, "kind": "b', "kind": kind, "ts": ts}
    if kind is None:
        del event["kind"]
    if ts == "missing":
        del event["ts"]
    if kind in ("escaped-a", "twice"):
        event["kind"] = "a"
    text = json.dumps(event)
    if kind == "escaped-a":
        text = text.replace('"kind": "a"', '"kind": "\\u0061"')
    if kind == "twice":
        text = text[:-1] + ', "kind": "b"}'
    at %= max(1, len(text))
    if how == "truncate":
        text = text[:at]
    elif how == "garbage":
        text = text[:at] + "\x00}{" + text[at:]
    elif how == "tail":
        text += " x"
    return text.encode()


def _summary(outcome: Outcome) -> tuple[object, ...]:
    # The parts' own order (a batch's datasets by their first line) is no promise.
    parts = sorted(
        (p.dataset, p.folder, p.times, tuple(unpack(p.records))) for p in outcome.parts or []
    )
    lines = [(ev.payload, ev.where, reason, detail) for ev, reason, detail in outcome.line_failures]
    return parts, sorted(lines), outcome.line_events, sorted(outcome.fallbacks.items())


def _request(target: Target, lines: list[bytes]) -> EncodeRequest:
    text = b"".join(p.replace(b"\n", b" ") + b"\n" for p in lines)
    return EncodeRequest(
        "@s", [], Lines(text, "l", 0, 1 << 20), target.config.datasets["a"].compression, None
    )


def _both(target: Target, lines: list[bytes]) -> tuple[Outcome, Outcome]:
    request = _request(target, lines)
    fused = encode_with(target, request)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target, "fused", None)
        scanned = encode_with(target, request)
    return fused, scanned


TARGETS = {
    (default, zone, feature): _target(default, zone, kind_feature=feature)
    for default in (False, True)
    for zone in ("UTC", "America/New_York")
    for feature in (False, True)
}


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(st.lists(LINES, max_size=40), st.booleans(), st.booleans(), st.booleans())
def test_the_fused_route_gives_what_the_scan_and_the_record_reads_give(
    lines: list[tuple[object, object, str, int]], default: bool, zoned: bool, feature: bool
) -> None:
    target = TARGETS[default, "America/New_York" if zoned else "UTC", feature]
    assert target.fused is not None
    assert target.fused.time == "ts"
    payloads = [_line(i, *line) for i, line in enumerate(lines)]
    fused, scanned = _both(target, payloads)
    assert _summary(fused) == _summary(scanned)


@needs_compiled
def test_a_batch_of_plain_lines_is_routed_and_filed_without_python() -> None:
    target = _target(False)
    payloads = [
        _line(i, ("a", "b")[i % 2], 1_764_000_000 + 3600 * (i % 5), "none", 0) for i in range(50)
    ]
    assert target.fused is not None
    groups, rest = target.fused.plan.encode_routed(payloads, b"kind", (b"a", b"b", b"7"), b"ts")
    assert rest == []
    assert [len(g[0]) for g in groups] == [25, 25, 0, 0]
    fused, scanned = _both(target, payloads)
    assert _summary(fused) == _summary(scanned)
    assert {p.folder for p in fused.parts or [] if p.dataset == "a"} == {
        f"dt=2025-11-24/hour={h:02d}" for h in range(16, 21)
    }


def test_datasets_of_different_encoders_scan_the_route_first() -> None:
    assert _target(False, b="f").fused is None


@needs_compiled
def test_a_time_the_datasets_do_not_share_is_read_from_the_records() -> None:
    target = _target(False, b_partitioned=False)
    assert target.fused is not None
    assert target.fused.time == "ts"
    payloads = [_line(i, ("a", "b")[i % 2], 1_764_000_000 + 7200 * i, "none", 0) for i in range(20)]
    fused, scanned = _both(target, payloads)
    assert _summary(fused) == _summary(scanned)


@needs_compiled
def test_a_plan_out_of_memory_leaves_the_batch_to_the_scan() -> None:
    target = _target(True)
    payloads = [
        _line(i, ("a", "b", "c")[i % 3], 1_764_000_000 + 900 * i, "none", 0) for i in range(30)
    ]
    _, scanned = _both(target, payloads)

    class _NoMemory:
        def encode_routed(self, *args: object) -> None:
            raise MemoryError

    assert target.fused is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target.fused, "plan", _NoMemory())
        assert _summary(encode_with(target, _request(target, payloads))) == _summary(scanned)
