"""Hostile values through the schema encoders: no event can stop ingestion, and no number is
silently changed.

Every feature option (``time_unit``, ``path``, ``shape``, ``default``, ``required``, ``length``,
``separator``) is drawn with hostile values, and so are the events: integers of hundreds of
digits, fractions of thousands, exponents past any float, timestamps written with non-ASCII
digits, lists nested deeper than Python recurses. Each batch goes through both encode paths (the
compiled ``_cexample`` plan where the schema is eligible, and pure Python), as JSON events, as
JSON lines, as events a source already parsed, and as CSV rows. The rules held:

- building an encoder either works or raises a config error;
- encoding never raises: every event is a record or a failure with a reason from a fixed set;
- both paths give the same records and the same failures, event for event;
- an event's outcome does not depend on the other events of its batch.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import anyio
import orjson
import pydantic
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.integration.test_daemon_spool import run_until_drained
from tests.support import dead_letters, read_examples, read_ids, spool_file, write_config
from tfrecordd import speedups
from tfrecordd.config import load_config, parse_config
from tfrecordd.format import proto
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import unpack
from tfrecordd.pipeline.encoding import ENCODER_ERROR, Outcome, encode_events
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import (
    Encoder,
    EncodeResult,
    Failure,
    FailureReason,
    Lines,
    RawEvent,
    Registry,
)
from tfrecordd_plugins.encoders.example import ExampleEncoder, ExampleEncoderConfig
from tfrecordd_plugins.encoders.sequence import SequenceEncoderConfig
from tfrecordd_plugins.sources.socket import TcpSource

REASONS = {"malformed", "schema", "format"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

settings.register_profile(
    "reliability",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "reliability-long",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
hostile = settings(
    settings.get_profile(os.environ.get("TFRECORDD_HYPOTHESIS_PROFILE", "reliability"))
)

FULLWIDTH = {ord("0") + i: 0xFF10 + i for i in range(10)}
ARABIC_INDIC = {ord("0") + i: 0x0660 + i for i in range(10)}
STAMP = "2024-02-29T23:59:58"

# --- hostile values, as JSON text --------------------------------------------------------------

NUMBER_TEXTS = [
    "0",
    "-0",
    "1.0",
    "3.5",
    "-0.5",
    "1e3",
    "1E-3",
    "1.0000000000000001",
    "9007199254740993.0",
    "9007199254740993",
    "-9223372036854775809",
    "-9223372036854775808",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1" + "0" * 300,
    "1" + "0" * 400,  # past any double: orjson refuses the event
    "1e5000",
    "-1e5000",
    "1e-5000",
    "0e99999999999999999999",
    "1.5e-99999999999999999999",
    "1." + "0" * 5000 + "1",
    "1700000000." + "9" * 5000,
    "1700000000.123456789",
    "3.4028235677973366e38",
    "1" + "9" * 30 + "e-20",
]

STRING_TEXTS = [
    f"{STAMP}Z",
    f"{STAMP}.{'9' * 5000}Z",
    f"{STAMP}.{'1' * 100000}+01:00",
    f"{STAMP}.Z",
    STAMP.translate(FULLWIDTH) + "Z",
    STAMP.translate(ARABIC_INDIC) + "Z",
    f"{STAMP}+" + "01:00".translate(ARABIC_INDIC),
    f"{STAMP}." + "123".translate(ARABIC_INDIC) + "Z",
    "9999-12-31T23:59:59Z",
    "0000-01-01T00:00:00Z",
    "1e5000",
    "9" * 5000,
    "nan",
    "",
    "\u00e9\u2028",
]


def deep(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


CONTAINER_TEXTS = [
    "[]",
    "[[]]",
    "[1, 2.5, 3]",
    "[[1, 2], [3, 4]]",
    "[[1, 2], [3]]",
    '{"a": 1}',
    "true",
    "null",
    deep(50),
    deep(990),  # deeper than Python's json module recurses
    deep(1100),  # deeper than orjson parses
    "[" + ", ".join(["1"] * 2000) + "]",
    '["' + "x" * 20000 + '"]',
]


def number_texts() -> st.SearchStrategy[str]:
    digits = st.text("0123456789", min_size=1, max_size=40)
    built = st.builds(
        lambda sign, whole, frac, exp: sign + whole.lstrip("0").rjust(1, "0") + frac + exp,
        st.sampled_from(["", "-"]),
        digits,
        st.one_of(st.just(""), digits.map(lambda d: "." + d)),
        st.one_of(st.just(""), st.integers(-400, 400).map(lambda e: f"e{e}")),
    )
    return st.one_of(st.sampled_from(NUMBER_TEXTS), built)


def value_texts() -> st.SearchStrategy[str]:
    leaf = st.one_of(
        number_texts(),
        st.sampled_from(STRING_TEXTS).map(json.dumps),
        st.text(max_size=6).map(json.dumps),
        st.sampled_from(CONTAINER_TEXTS),
    )
    return st.one_of(
        leaf,
        st.lists(leaf, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.lists(leaf, max_size=3), max_size=3).map(
            lambda rows: "[" + ", ".join("[" + ", ".join(r) + "]" for r in rows) + "]"
        ),
    )


NUMBERS = number_texts()
VALUES = value_texts()
CSV_FIELDS = st.one_of(st.sampled_from(NUMBER_TEXTS + STRING_TEXTS), st.text(max_size=6), NUMBERS)
"""Built once: hypothesis validates a strategy the first time it draws from it."""


# --- hostile feature options -------------------------------------------------------------------

PATHS = [
    None,
    "a",
    "a.b",
    "a.0",
    "a[0]",
    "a[-1]",
    "a[0][1]",
    "a.b.c",
    "a[1]".translate(ARABIC_INDIC),
    "a.3".translate(ARABIC_INDIC),
    "a[3]".translate(FULLWIDTH),
    "a[99999999999999999999]",
    "a[" + "9" * 5000 + "]",
    "",
    ".",
    "a..b",
    "[0]",
    "a]",
    "ü.ß",
]

DEFAULTS: list[Any] = [
    None,
    0,
    -1,
    2**63 - 1,
    2**63,
    2**70,
    10**5000,
    1.5,
    3.0,
    float("nan"),
    float("inf"),
    1e300,
    "x",
    f"{STAMP}Z",
    f"{STAMP}.{'9' * 5000}Z",
    STAMP.translate(FULLWIDTH) + "Z",
    "\ud800",
    True,
    [],
    [1, 2, 3],
    [[1, 2], [3, 4]],
    [[[[[[[[[[1]]]]]]]]]],
    {"a": 1},
]


TYPED_DEFAULTS: dict[str, list[Any]] = {
    "int64": [0, -1, 2**63 - 1, 3.0, [1, 2], [[1, 2], [3, 4]], f"{STAMP}Z", 1700000000.5],
    "float": [1.5, float("nan"), float("-inf"), -0.0, [0.25, float("nan")], 2**70],
    "bytes": ["x", "", "\u2028", ["a", "b"], [["a"], ["b"]]],
}


PATH_OPTION = st.one_of(st.sampled_from(PATHS), st.text(max_size=6))
ANY_OPTION: dict[str, st.SearchStrategy[Any]] = {
    "path": PATH_OPTION,
    "time_unit": st.sampled_from([None, "s", "ms", "us", "ns", "h"]),
    "shape": st.sampled_from([None, [], [2], [0], [-1], [2**40], [1] * 2000]),
    "default": st.sampled_from(DEFAULTS),
    "required": st.booleans(),
    "length": st.booleans(),
    "separator": st.sampled_from([None, ",", "", "3".translate(ARABIC_INDIC)]),
}


@st.composite
def feature_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A feature's options: mostly ones a config could hold (so that most specs build), with
    hostile values among them; now and then any value of any option."""
    kind = draw(st.sampled_from(["int64", "float", "bytes"]))
    spec: dict[str, Any] = {"type": kind}
    if draw(st.integers(0, 3)) == 0:
        for option, values in ANY_OPTION.items():
            if draw(st.booleans()):
                spec[option] = draw(values)
        return spec
    if draw(st.booleans()):
        spec["path"] = draw(PATH_OPTION)
    if kind == "int64" and draw(st.booleans()):
        spec["time_unit"] = draw(st.sampled_from(["s", "ms", "us", "ns"]))
    elif kind == "int64" and draw(st.integers(0, 4)) == 0:
        spec["length"] = True
    if not spec.get("length") and draw(st.booleans()):
        spec["shape"] = draw(st.sampled_from([[], [1], [2], [2, 2], [1] * 40, [2**40]]))
    usage = draw(st.sampled_from(["plain", "required", "default"]))
    if usage == "required":
        spec["required"] = True
    elif usage == "default":
        spec["default"] = draw(st.sampled_from(TYPED_DEFAULTS[kind] + DEFAULTS[:8]))
    if draw(st.integers(0, 4)) == 0:
        spec["separator"] = draw(st.sampled_from([",", ";"]))
    return spec


def valid(specs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The specs that build; the others must be refused as config errors, and only so."""
    out = {}
    for name, spec in specs.items():
        try:
            ExampleEncoderConfig.model_validate({"features": {name: spec}})
        except pydantic.ValidationError:
            continue
        out[name] = spec
    return out


def place(path: str | None, name: str, value: str) -> str:
    """A JSON object text holding ``value`` where ``path`` points (roughly: a wrong guess is
    a missing value, which is fine)."""
    keys = (path or name).replace("[", ".").replace("]", "").split(".")
    text = value
    for key in reversed(keys):
        if key.lstrip("-").isdigit() and key.isascii() and len(key) < 5:
            index = int(key)
            text = "[" + ", ".join(["0"] * max(index, -index - 1) + [text]) + "]"
        else:
            text = "{" + json.dumps(key) + ": " + text + "}"
    return text


def merge(objects: list[str]) -> str:
    """One object with the members of each (duplicates kept, as a producer may write them)."""
    members = [o[1:-1] for o in objects if o.startswith("{") and len(o) > 2]
    return "{" + ", ".join(members) + "}"


@st.composite
def batches(draw: st.DrawFn, specs: dict[str, dict[str, Any]]) -> list[RawEvent]:
    events = []
    for _ in range(draw(st.integers(1, 6))):
        objects = [
            place(spec.get("path"), name, draw(VALUES))
            for name, spec in specs.items()
            if draw(st.booleans())
        ]
        text = merge(objects) if draw(st.integers(0, 5)) else draw(VALUES)
        payload = text.encode()
        form = draw(st.sampled_from(["json", "json", "parsed", "csv", "garbage"]))
        if form == "parsed":
            try:
                parsed = orjson.loads(payload)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                parsed["added_by_source"] = "1700000000-0"  # as redis id_field does
            events.append(RawEvent(payload, "t", value=parsed))
        elif form == "csv":
            row = {
                (spec.get("path") or name): draw(CSV_FIELDS)
                for name, spec in specs.items()
                if isinstance(spec.get("path") or name, str)
            }
            events.append(RawEvent(b"row", "t.csv:2", value=row, format="csv"))
        elif form == "garbage":
            events.append(RawEvent(payload[: draw(st.integers(0, len(payload)))], "t"))
        else:
            events.append(RawEvent(payload, "t"))
    return events


def pure(encoder: Any) -> Any:
    """The same encoder without the compiled plan: the pure-Python path."""
    if isinstance(encoder, ExampleEncoder):
        twin = ExampleEncoder.__new__(ExampleEncoder)
        twin.schema, twin.plan = encoder.schema, None
        return twin
    return encoder


def outcomes(result: EncodeResult, n: int) -> list[Any]:
    """Per event: its record, or ``(reason, detail)``."""
    failed = {i: (reason, detail) for i, reason, detail in result.failures}
    assert len(failed) == len(result.failures), "an event failed twice"
    assert len(result.records) + len(failed) == n, "an event neither written nor failed"
    records = iter(result.records)
    return [failed[i] if i in failed else next(records) for i in range(n)]


def hold(encoder: Encoder, events: list[RawEvent]) -> None:
    """The rules of the module docstring, for one built encoder and one batch."""
    paths = [encoder, pure(encoder)]
    results = [p.encode_batch(events) for p in paths]
    assert results[0] == results[1], "the compiled and the Python paths disagree"
    got = outcomes(results[0], len(events))
    for ev, outcome in zip(events, got, strict=True):
        if isinstance(outcome, tuple):
            reason, detail = outcome
            assert reason in REASONS, outcome
            assert 0 < len(detail) < 400, outcome
        else:
            parse = (
                proto.parse_example
                if isinstance(encoder, ExampleEncoder)
                else proto.parse_sequence_example
            )
            parse(outcome)
        for p in paths:
            assert outcomes(p.encode_batch([ev]), 1) == [outcome], "depends on the batch"
    lines = [ev for ev in events if ev.value is None and ev.format is None]
    payloads = [ev.payload for ev in lines]
    expected = outcomes(paths[1].encode_batch(lines), len(lines))
    for p in paths:
        assert outcomes(p.encode_lines(payloads), len(payloads)) == expected


@st.composite
def example_cases(draw: st.DrawFn) -> tuple[Any, list[RawEvent]]:
    names = draw(st.lists(st.sampled_from(["a", "b", "n", "t", "é"]), min_size=1, unique=True))
    specs = valid({name: draw(feature_specs()) for name in names})
    if not specs:
        return None, []
    config = ExampleEncoderConfig.model_validate({"features": specs})
    return config, draw(batches(specs))


@hostile
@given(example_cases())
def test_hostile_options_and_values_through_both_example_paths(
    case: tuple[Any, list[RawEvent]],
) -> None:
    config, events = case
    if config is not None:
        hold(config.build(), events)


@st.composite
def sequence_cases(draw: st.DrawFn) -> tuple[Any, list[RawEvent]]:
    names = draw(st.lists(st.sampled_from(["a", "n", "t"]), min_size=1, unique=True))
    context = valid({name: draw(feature_specs()) for name in names})
    lists = valid({name + "s": draw(feature_specs()) for name in names})
    lists = {name: spec for name, spec in lists.items() if not spec.get("length")}
    steps = draw(st.sampled_from([None, "steps", "a[0]", "a.3".translate(ARABIC_INDIC)]))
    try:
        config = SequenceEncoderConfig.model_validate(
            {"context": context, "feature_lists": lists, "steps": steps}
        )
    except pydantic.ValidationError:
        return None, []
    return config, draw(batches(context | lists))


@hostile
@given(sequence_cases())
@example(
    (
        SequenceEncoderConfig.model_validate(
            {
                "context": {"t": {"type": "int64", "time_unit": "us"}},
                "feature_lists": {"ts": {"type": "int64", "time_unit": "ms"}},
            }
        ),
        [
            RawEvent(f'{{"t": "{STAMP}.{"9" * 5000}Z", "ts": [1.5]}}'.encode(), "t"),
            RawEvent(f'{{"t": 1, "ts": ["{STAMP}.{"1" * 5000}Z", 1.0]}}'.encode(), "t"),
            RawEvent(b'{"t": 1, "ts": [1e300]}', "t"),
        ],
    )
)
def test_hostile_options_and_values_through_the_sequence_encoder(
    case: tuple[Any, list[RawEvent]],
) -> None:
    config, events = case
    if config is not None:
        hold(config.build(), events)


def test_the_compiled_path_is_exercised() -> None:
    if speedups.load("_cexample") is None:
        pytest.skip("tfrecordd._cexample is not built")
    encoder = ExampleEncoderConfig.model_validate({"features": {"n": "int64"}}).build()
    assert isinstance(encoder, ExampleEncoder)
    assert encoder.plan is not None
    assert pure(encoder).plan is None


# --- the events of the issue, one by one -------------------------------------------------------

TIME = {"id": {"type": "int64", "required": True}, "t": {"type": "int64", "time_unit": "ns"}}


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (f'{{"id": 2, "t": "{STAMP}.{"9" * 5000}Z"}}', None),
        (f'{{"id": 2, "t": "{STAMP}.{"1" * 100000}Z"}}', None),
        (f'{{"id": 2, "t": {"1" * 300}}}', "feature 't': int64 out of range"),
        (f'{{"id": 2, "t": 1{"0" * 5000}}}', "feature 't': int64 out of range"),
        (f'{{"id": 2, "t": "{STAMP.translate(FULLWIDTH)}Z"}}', "not an RFC 3339 timestamp"),
        (f'{{"id": 2, "t": "{STAMP.translate(ARABIC_INDIC)}Z"}}', "not an RFC 3339 timestamp"),
        (f'{{"id": 2, "t": "{STAMP}.{"123".translate(ARABIC_INDIC)}Z"}}', "not an RFC 3339"),
        (f'{{"id": 2, "t": "{STAMP}+{"01:00".translate(FULLWIDTH)}"}}', "not an RFC 3339"),
        (f'{{"id": 2.5, "x": {deep(10)}}}', "feature 'id': expected int64, got float 2.5"),
        (f'{{"id": 2.5, "x": {deep(995)}}}', "nested too deeply to read its numbers exactly"),
        (f'{{"id": 2.0, "x": {deep(995)}}}', "nested too deeply to read its numbers exactly"),
    ],
)
def test_one_bad_event_fails_alone(payload: str, detail: str | None) -> None:
    encoder = ExampleEncoderConfig.model_validate({"features": TIME}).build()
    good = [RawEvent(b'{"id": 1, "t": 5}', "t"), RawEvent(b'{"id": 3}', "t")]
    events = [good[0], RawEvent(payload.encode(), "t"), good[1]]
    result = encoder.encode_batch(events)
    if detail is None:  # a fraction of any length is floored to the nanosecond
        fraction = 999999999 if "9" * 50 in payload else 111111111
        assert proto.parse_example(result.records[1])["t"] == [1709251198 * 10**9 + fraction]
        return
    assert [proto.parse_example(r)["id"] for r in result.records] == [[1], [3]]
    assert [(i, reason) for i, reason, _ in result.failures] == [
        (1, "malformed" if "JSON" in detail else "schema")
    ]
    assert detail in result.failures[0][2]
    assert len(result.failures[0][2]) < 300


@pytest.mark.parametrize(
    "text",
    [
        "1e5000",
        "-1e5000",
        "1e999999999999999999999",
        "9" * 5000,
        "-" + "9" * 5000,
        "1." + "9" * 100000,
        STAMP + "." + "9" * 5000 + "Z",
        STAMP.translate(FULLWIDTH) + "Z",
        "1700000000".translate(FULLWIDTH),
        "1700000000".translate(ARABIC_INDIC),
    ],
)
def test_one_bad_csv_field_fails_alone(text: str) -> None:
    encoder = ExampleEncoderConfig.model_validate({"features": TIME}).build()
    rows = [{"id": "1", "t": "5"}, {"id": "2", "t": text}, {"id": "3", "t": ""}]
    events = [RawEvent(b"row", f"f.csv:{i}", value=row, format="csv") for i, row in enumerate(rows)]
    result = encoder.encode_batch(events)
    if text.startswith("1.") or text.startswith(STAMP + "."):
        assert len(result.records) == 3  # a long fraction floors: it fits
        return
    assert [proto.parse_example(r)["id"] for r in result.records] == [[1], [3]]
    [(index, reason, detail)] = result.failures
    assert (index, reason) == (1, "schema")
    assert detail.startswith("feature 't': ")
    assert len(detail) < 200


# --- int64: the number the text says, or a refusal ---------------------------------------------


def exact(text: str) -> Decimal:
    """The number ``text`` says, by Decimal arithmetic. An exponent beyond +-20000 is clamped
    to it: with the few thousand digits drawn here, that changes neither whether the number is an
    integer in int64, nor its floor at any unit."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and abs(int(exponent)) > 20000:
        exponent = "20000" if int(exponent) > 0 else "-20000"
    with localcontext() as ctx:
        ctx.prec = 100000
        return Decimal(mantissa + ("e" + exponent if exponent else ""))


@hostile
@given(NUMBERS)
@example("-9223372036854775809")
@example("1.0000000000000001")
@example("9007199254740993.0")
@example("1.0")
@example("-0.0")
def test_int64_takes_exactly_the_written_number_or_refuses_it(text: str) -> None:
    encoder = ExampleEncoderConfig.model_validate({"features": {"n": "int64"}}).build()
    payload = b'{"n": %s}' % text.encode()
    for path in (encoder, pure(encoder)):
        [outcome] = outcomes(path.encode_batch([RawEvent(payload, "t")]), 1)
        value = exact(text)
        fits = value == value.to_integral_value() and INT64_MIN <= value <= INT64_MAX
        if isinstance(outcome, bytes):
            assert fits, text
            assert proto.parse_example(outcome) == {"n": [int(value)]}
        else:
            assert not fits or outcome[0] == "malformed", text
            if outcome[0] == "schema":
                assert outcome[1].startswith("feature 'n': ")


@hostile
@given(NUMBERS, st.sampled_from(["s", "ms", "us", "ns"]))
@example("1700000000.123456789", "ns")
@example("0.7", "ms")
@example("-0.0000000001", "ns")
@example("1700000000.1234567", "ms")  # the float alone decides: no second parse
@example("1700000000.25", "ms")
@example("1700000000.1229999999", "ms")  # the same double as 1700000000.123
@example("-1700000000.1234567", "us")
@example("4503599627370495.5", "s")
@example("1e-320", "ns")
@example("-0.0", "s")
def test_timestamps_in_seconds_are_floored_exactly(text: str, unit: str) -> None:
    features = {"t": {"type": "int64", "time_unit": unit}}
    encoder = ExampleEncoderConfig.model_validate({"features": features}).build()
    scale = {"s": 0, "ms": 3, "us": 6, "ns": 9}[unit]
    with localcontext() as ctx:
        ctx.prec = 100000
        expected = (exact(text).scaleb(scale)).to_integral_value(rounding="ROUND_FLOOR")
    fits = INT64_MIN <= expected <= INT64_MAX
    events = [
        RawEvent(b'{"t": %s}' % text.encode(), "t"),
        RawEvent(b"row", "t.csv:1", value={"t": text}, format="csv"),
    ]
    for ev in events:
        [outcome] = outcomes(encoder.encode_batch([ev]), 1)
        if isinstance(outcome, bytes):
            assert fits, text
            assert proto.parse_example(outcome) == {"t": [int(expected)]}, text
        else:
            assert not fits or outcome[0] == "malformed", (text, outcome)


def test_int64_in_a_sequence_and_in_an_event_a_source_parsed() -> None:
    config = SequenceEncoderConfig.model_validate(
        {"context": {"n": "int64"}, "feature_lists": {"xs": "int64"}}
    )
    encoder = config.build()
    payloads = [
        b'{"n": 1.0, "xs": [[1.0], [2e0]]}',
        b'{"n": 1.0000000000000001, "xs": [[1]]}',
        b'{"n": 1, "xs": [[9007199254740993.0]]}',
        b'{"n": 1, "xs": [[-9223372036854775809]]}',
    ]
    result = encoder.encode_batch([RawEvent(p, "t") for p in payloads])
    assert [proto.parse_sequence_example(r) for r in result.records] == [
        ({"n": [1]}, {"xs": [[1], [2]]}),
        ({"n": [1]}, {"xs": [[9007199254740993]]}),
    ]
    assert [(i, detail) for i, _, detail in result.failures] == [
        (1, "feature 'n': expected int64, got float 1.0000000000000001"),
        (3, "feature 'xs': step 0: int64 out of range: -9223372036854775809"),
    ]
    # A source that parsed the payload and added a key (the Redis source's id_field) keeps it.
    example = ExampleEncoderConfig.model_validate(
        {"features": {"n": "int64", "id": "bytes"}}
    ).build()
    for text, n in ((b'{"n": 7.0}', 7), (b'{"n": 1.0000000000000001}', None)):
        parsed = orjson.loads(text) | {"id": "1-0"}
        result = example.encode_batch([RawEvent(text, "t", value=parsed)])
        if n is None:
            assert result.failures[0][1:] == (
                "schema",
                "feature 'n': expected int64, got float 1.0000000000000001",
            )
        else:
            assert proto.parse_example(result.records[0]) == {"n": [n], "id": [b"1-0"]}


# --- the daemon's boundary: an encoder that raises ---------------------------------------------


class Fragile(Encoder):
    """A third-party encoder with a bug that some events trigger: it raises instead of
    reporting them."""

    def encode_batch(self, events: Any) -> EncodeResult:
        result = EncodeResult()
        for i, ev in enumerate(events):
            if ev.payload.startswith(b"boom"):
                raise {b"boom-r": RecursionError, b"boom-m": MemoryError}.get(
                    ev.payload, ValueError
                )("the encoder's bug")
            if ev.payload == b"bad":
                result.failures.append(Failure(i, FailureReason.SCHEMA, "reported as it should be"))
            else:
                result.records.append(b"record:" + ev.payload)
        return result


def _records(outcome: Outcome) -> list[bytes]:
    return unpack(outcome.records)


def test_an_event_the_encoder_raises_on_is_dead_lettered_alone() -> None:
    payloads = [b"a", b"boom", b"b", b"bad", b"boom-r", b"c", b"boom-m"]
    events = [RawEvent(p, f"t:{i}") for i, p in enumerate(payloads)]
    outcome = encode_events(Fragile(), events, None, Compression.NONE, None)
    assert _records(outcome) == [b"record:a", b"record:b", b"record:c"]
    assert [(i, reason) for i, reason, _ in outcome.failures] == [
        (1, ENCODER_ERROR),
        (3, "schema"),
        (4, ENCODER_ERROR),
        (6, ENCODER_ERROR),
    ]
    assert outcome.failures[0][2] == "the encoder raised ValueError"
    # The same for events the daemon sends as lines (a JSON-lines file).
    lines = Lines(b"a\nboom\nb\n\nboom-m\n", "f.jsonl", 100, 1 << 10)
    outcome = encode_events(Fragile(), [], lines, Compression.NONE, None)
    assert _records(outcome) == [b"record:a", b"record:b"]
    assert [(ev.where, reason) for ev, reason, _ in outcome.line_failures] == [
        ("f.jsonl:102", ENCODER_ERROR),
        ("f.jsonl:110", ENCODER_ERROR),
    ]


# --- the daemon: one hostile event in a spool file or on a TCP line ----------------------------

DAEMON_FEATURES = {
    "id": {"type": "int64", "required": True},
    "t": {"type": "int64", "time_unit": "ns"},
    "n": "int64",
}
HOSTILE_LINES = [
    f'{{"id": 1000, "t": "{STAMP}.{"9" * 5000}Z"}}',  # written: floored to the nanosecond
    '{"id": 1001, "n": 9007199254740993.0}',  # written exactly
    f'{{"id": 1002, "t": "{STAMP.translate(FULLWIDTH)}Z"}}',
    '{"id": 1003, "n": -9223372036854775809}',
    '{"id": 1004, "n": 1.0000000000000001}',
    '{"id": 1005, "t": 1e5000}',
    f'{{"id": 1006, "t": "{STAMP}.{"1" * 5000}Z", "x": {deep(995)}}}',  # written
    f'{{"id": 1007, "n": 2.0, "x": {deep(995)}}}',
]
HOSTILE_ROWS = ["1e5000", "-1e5000", "9" * 5000, STAMP.translate(ARABIC_INDIC) + "Z"]


@pytest.mark.anyio
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
async def test_the_daemon_dead_letters_hostile_events_and_goes_on(
    tmp_path: Path, fmt: str, workers: int
) -> None:
    # Two workers: the events are encoded in a worker process too.
    cfg = write_config(
        tmp_path,
        daemon={"encode_workers": workers},
        source={"pattern": f"*.{fmt}", "format": fmt},
        features=DAEMON_FEATURES,
    )
    spool = tmp_path / "spool"
    if fmt == "jsonl":
        good = [json.dumps({"id": i, "t": i, "n": i}) for i in range(200)]
        spool_file(spool, "a.jsonl", good[:100] + HOSTILE_LINES + good[100:])
        written, refused = {1000, 1001, 1006}, {1002, 1003, 1004, 1005, 1007}
    else:
        good = [f"{i},{i},{i}" for i in range(200)]
        bad = [f"{1000 + i},{text},1" for i, text in enumerate(HOSTILE_ROWS)]
        spool_file(spool, "a.csv", ["id,t,n", *good[:100], *bad, *good[100:]])
        written, refused = set(), {1000 + i for i in range(len(HOSTILE_ROWS))}
    daemon = Daemon(load_config(cfg), handle_signals=False)
    await run_until_drained(tmp_path, daemon, 200 + len(written) + len(refused))

    assert read_ids(tmp_path / "shards") == dict.fromkeys([*range(200), *written], 1)
    letters = dead_letters(tmp_path / "state")
    # The id leads each line (or row): read it without parsing what follows.
    ids = [int(d["raw"].split(",")[0].removeprefix('{"id": ')) for d in letters]
    assert sorted(ids) == sorted(refused)
    assert len(letters) == len(refused)
    assert {d["reason"] for d in letters} <= {"schema", "malformed"}
    assert all(len(d["detail"]) < 300 for d in letters)
    examples = {int(ex["id"][0]): ex for ex in read_examples(tmp_path / "shards")}
    if fmt == "jsonl":
        assert examples[1000]["t"] == [1709251198_999999999]
        assert examples[1001]["n"] == [9007199254740993]


@pytest.mark.anyio
async def test_one_tcp_line_cannot_stop_the_daemon(tmp_path: Path) -> None:
    data = {
        "daemon": {"node_id": "test", "state_dir": str(tmp_path / "state")},
        "metrics": {"enabled": False},
        "output": {"dir": str(tmp_path / "shards"), "max_shard_age": "1h"},
        "sources": [
            {"name": "in", "encoder": "e", "type": "tcp", "listen": "127.0.0.1:0", "ack": True}
        ],
        "encoders": {"e": {"type": "example", "features": DAEMON_FEATURES}},
    }
    daemon = Daemon(parse_config(data, Registry.from_entry_points()), handle_signals=False)
    lines = [b'{"id": 1, "t": 1}', *(h.encode() for h in HOSTILE_LINES), b'{"id": 2, "t": 2}']
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        source = daemon.sources["in"]
        assert isinstance(source, TcpSource)
        assert source.address is not None
        async with await anyio.connect_tcp(*source.address[:2]) as conn:
            await conn.send(b"".join(line + b"\n" for line in lines))
            with anyio.fail_after(30):
                while daemon.metrics.registry.get_sample_value(
                    "tfrecordd_events_received_total", {"source": "in"}
                ) != len(lines):
                    await anyio.sleep(0.02)
            daemon.request_flush()
            buf = b""
            with anyio.fail_after(30):
                while not buf.endswith(b"\n"):
                    buf += await conn.receive()
            assert buf == f"ACK {len(lines)}\n".encode()
        daemon.request_stop()
    assert read_ids(tmp_path / "shards") == dict.fromkeys([1, 2, 1000, 1001, 1006], 1)
    assert len(dead_letters(tmp_path / "state")) == 5


def test_a_source_value_without_json_text_is_taken_at_its_value() -> None:
    # A source that structures events itself (no JSON payload): its floats are values.
    encoder = ExampleEncoderConfig.model_validate({"features": {"n": "int64"}}).build()
    events = [
        RawEvent(b"", "t", value={"n": 4.0}),
        RawEvent(b"\xff", "t", value={"n": 2.5}),
        RawEvent(b"", "t", value={"n": 1e19}),
    ]
    result = encoder.encode_batch(events)
    assert [proto.parse_example(r) for r in result.records] == [{"n": [4]}]
    assert [(i, detail) for i, _, detail in result.failures] == [
        (1, "feature 'n': expected int64, got float 2.5"),
        (2, "feature 'n': int64 out of range: 10000000000000000000"),
    ]
