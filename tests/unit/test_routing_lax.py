"""A route into datasets whose encoders parse their JSON whole reads its field without checking
the rest of each payload in C (``lax``). Whatever the payloads (valid, broken, keys twice,
escapes, another value, no default), a batch's outcome is the one Python's reading of every
payload gives: the same records in the same parts, the same failures with the same reasons and
details; a payload that is not JSON fails as ``malformed``, in any dataset or none."""

from __future__ import annotations

import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd import speedups
from tfrecordd.config import parse_config
from tfrecordd.events import FailureReason, Lines, RawEvent
from tfrecordd.format.writer import unpack
from tfrecordd.pipeline import routing
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
[datasets.b]
encoder = "s"
dir = "/nonexistent/b"
compression = "zlib"
[[sources]]
name = "s"
type = "directory"
path = "/nonexistent/spool"
route = {{ field = "kind", to = {{ a = "a", b = "b" }}{default} }}
[encoders.e]
type = "example"
[encoders.e.features]
id = "int64"
kind = "bytes"
[encoders.s]
type = "sequence"
[encoders.s.context]
id = "int64"
[encoders.s.feature_lists]
x = "int64"
"""

needs_compiled = pytest.mark.skipif(
    speedups.load("_cexample") is None, reason="the compiled reader is not built"
)


def _target(default: bool) -> Target:
    text = CONFIG.format(default=', default = "a"' if default else "")
    config = parse_config(tomllib.loads(text), Registry.from_entry_points())
    plan = plan_encoding(config)
    built = plan.builders[plan.sources["s"].target].build()
    assert isinstance(built, Target)
    return built


TARGETS = {default: _target(default) for default in (False, True)}


def _event(i: int, kind: str | None, twice: str | None, escaped: bool) -> bytes:
    # A quote and braces inside strings: a reader that does not skip strings whole finds a
    # "kind" in "q".
    event = {"id": i, "q": 'x"}, "kind": "b', "kin": "b", "kind": kind, "kinder": "b", "x": [i]}
    if kind is None:
        del event["kind"]
    text = json.dumps(event)
    if escaped and kind is not None:
        text = text.replace(
            f'"kind": "{kind}"', '"kind": "' + "".join(f"\\u{ord(c):04x}" for c in kind) + '"'
        )
    if twice is not None:
        text = text[:-1] + f', "kind": "{twice}"}}'
    return text.encode()


BREAKS = st.sampled_from(["none", "truncate", "garbage", "flip", "tail", "bad literal", "quote"])


def _broken(payload: bytes, how: str, at: int) -> bytes:
    at %= max(1, len(payload))
    if how == "truncate":
        return payload[:at]
    if how == "garbage":
        return payload[:at] + b"\x00}{" + payload[at:]
    if how == "flip":
        return payload[:at] + bytes([payload[at] ^ 0x80]) + payload[at + 1 :]
    if how == "tail":
        return payload + b" x"
    if how == "bad literal":
        return payload[:-1] + b', "z": tru}'
    if how == "quote":
        return payload.replace(b'"id"', b'"id\\"', 1)
    return payload


EVENTS = st.tuples(
    st.sampled_from(["a", "b", "c", "", None]),
    st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    st.booleans(),
    BREAKS,
    st.integers(0, 200),
)


def _summary(outcome: Outcome) -> tuple[object, ...]:
    parts = sorted(
        ((p.dataset, p.folder, tuple(unpack(p.records))) for p in outcome.parts or []),
    )
    failures = sorted((f.at, f.reason, f.detail) for f in outcome.failures)
    lines = sorted((ev.payload, reason, detail) for ev, reason, detail in outcome.line_failures)
    return parts, failures, lines


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(EVENTS, max_size=30), st.lists(EVENTS, max_size=30), st.booleans())
def test_lax_routing_gives_what_reading_every_payload_in_python_gives(
    as_events: list[tuple[str | None, str | None, bool, str, int]],
    as_lines: list[tuple[str | None, str | None, bool, str, int]],
    default: bool,
) -> None:
    target = TARGETS[default]
    assert target.lax
    payloads = [
        _broken(_event(i, kind, twice, esc), how, at)
        for i, (kind, twice, esc, how, at) in enumerate([*as_events, *as_lines])
    ]
    events = [RawEvent(p, f"e{i}") for i, p in enumerate(payloads[: len(as_events)])]
    text = b"".join(p.replace(b"\n", b" ") + b"\n" for p in payloads[len(as_events) :])
    request = EncodeRequest(
        "@s",
        events,
        Lines(text, "l", 0, 1 << 20) if text else None,
        target.config.datasets["a"].compression,
        None,
    )
    compiled = encode_with(target, request)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(routing, "string_groups", lambda *_, **__: None)
        python = encode_with(target, request)
    assert _summary(compiled) == _summary(python)
    # A payload that is not JSON fails as malformed, whatever it seems to hold.
    for f in compiled.failures:
        try:
            json.loads(events[f.at].payload)
        except ValueError:
            assert f.reason is FailureReason.MALFORMED
            assert f.detail.startswith("not valid JSON: ")


@needs_compiled
def test_a_broken_payload_with_a_value_no_route_names_fails_as_malformed() -> None:
    broken = b'{"id": 1, "kind": "c", "z": tru}'
    target = TARGETS[False]
    request = EncodeRequest(
        "@s", [RawEvent(broken, "e0")], None, target.config.datasets["a"].compression, None
    )
    for patched in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            if patched:
                patch.setattr(routing, "string_groups", lambda *_, **__: None)
            (failure,) = encode_with(target, request).failures
        assert failure.reason is FailureReason.MALFORMED


def test_a_route_into_an_encoder_that_does_not_parse_json_reads_strictly() -> None:
    text = CONFIG.format(default="").replace(
        '[encoders.s]\ntype = "sequence"', '[encoders.s]\ntype = "passthrough"'
    )
    text = text[: text.index("[encoders.s.context]")]
    config = parse_config(tomllib.loads(text), Registry.from_entry_points())
    plan = plan_encoding(config)
    built = plan.builders[plan.sources["s"].target].build()
    assert isinstance(built, Target)
    assert not built.lax
