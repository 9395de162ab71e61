"""The compiled JSON → Example path (tfrecordd._cexample) against the Python path it stands in for.

The rule under test: whenever the plan returns bytes for a payload, the Python path
(``ExampleSchema.encode_json``) succeeds on that payload and returns the same bytes.
``None`` is always allowed, and must come for anything the plan cannot be sure of.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import random
import struct
import threading
from typing import Any

import orjson
import pytest
from benchmarks.data import MOVIE_FEATURES, movie_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecordd import speedups
from tfrecordd.errors import EncodeError
from tfrecordd.format import proto
from tfrecordd.pipeline.routing import route_value
from tfrecordd.plugin import EncodeResult, RawEvent
from tfrecordd.schema import ExampleSchema
from tfrecordd.schema.numtext import PER_SECOND
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

cexample = speedups.load("_cexample")
pytestmark = pytest.mark.skipif(cexample is None, reason="tfrecordd._cexample is not built")

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_EDGE = [
    FLOAT32_MAX,
    3.4028235677973362e38,  # just below the rounding boundary: rounds down to FLOAT32_MAX
    3.4028235677973366e38,  # the boundary: rounds to infinity, refused
    3.5e38,
    1.401298464324817e-45,  # the smallest float32 subnormal
    7.006492321624085e-46,  # half of it: rounds to zero
    7.006492321624087e-46,  # just above half: rounds up to the subnormal
    1.1754943508222875e-38,
    5e-324,
    1.7976931348623157e308,
    0.1,
    -0.0,
    2.0**24 + 1,
]


def plan_for(schema: ExampleSchema) -> Any:
    assert cexample is not None
    features = schema.compiled_json_features()
    assert features is not None
    return cexample.ExamplePlan(features)


def python_path(schema: ExampleSchema, payload: bytes) -> bytes | None:
    """What the Python path writes for ``payload``, or ``None`` when it refuses it."""
    try:
        return schema.encode_json(payload)
    except (orjson.JSONDecodeError, EncodeError):
        return None


def check(schema: ExampleSchema, payloads: list[bytes], plan: Any = None) -> list[bytes | None]:
    """Hold every compiled answer to the rule; return the answers."""
    plan = plan if plan is not None else plan_for(schema)
    out = plan.encode_batch(payloads)
    assert len(out) == len(payloads)
    for payload, got in zip(payloads, out, strict=True):
        if got is not None:
            expected = python_path(schema, payload)
            assert expected is not None, f"compiled path accepted what Python refuses: {payload!r}"
            assert got == expected, payload
    return list(out)


def fast(features: dict[str, Any], payload: bytes) -> bytes:
    """The compiled record for ``payload``, which must take the fast path."""
    schema = ExampleSchema(features)
    (got,) = check(schema, [payload])
    assert got is not None, payload
    return got


def falls_back(features: dict[str, Any], payload: bytes) -> bool:
    schema = ExampleSchema(features)
    (got,) = check(schema, [payload])
    return got is None


# --- eligibility --------------------------------------------------------------------------------


def test_plain_features_are_eligible_with_their_default_entries() -> None:
    schema = ExampleSchema(
        {
            "a": "int64",
            "b": {"type": "float", "default": 1.5},
            "c": {"type": "bytes", "required": True},
            "d": {"type": "bytes", "path": "other"},
        }
    )
    features = schema.compiled_json_features()
    assert features is not None
    by_name = {f[0]: f for f in features}
    assert by_name[b"a"] == (b"a", b"a", "int64", False, None)
    assert by_name[b"c"] == (b"c", b"c", "bytes", True, None)
    assert by_name[b"d"][:4] == (b"d", b"other", "bytes", False)
    entry = by_name[b"b"][4]
    assert entry is not None
    # The entry alone, wrapped as an Example, parses to the default.
    assert proto.parse_example(b"\x0a" + bytes([len(entry)]) + entry) == {"b": [1.5]}


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "int64", "path": "user.age"},
        {"type": "int64", "path": "items[0]"},
        {"type": "int64", "path": "0"},
        {"type": "int64", "shape": [2]},
        {"type": "int64", "time_unit": "ms", "shape": [1]},
        {"type": "int64", "length": True},
    ],
)
def test_features_that_need_python_are_not_eligible(spec: dict[str, Any]) -> None:
    assert ExampleSchema({"x": spec, "y": "float"}).compiled_json_features() is None


def test_two_features_reading_one_key_are_not_eligible() -> None:
    schema = ExampleSchema({"a": "int64", "b": {"type": "float", "path": "a"}})
    assert schema.compiled_json_features() is None


def test_plan_refuses_bad_declarations() -> None:
    assert cexample is not None
    plan_type = cexample.ExamplePlan
    with pytest.raises(ValueError, match="unknown feature kind"):
        plan_type([(b"a", b"a", "int32", False, None)])
    with pytest.raises(ValueError, match="declared twice"):
        plan_type([(b"a", b"a", "int64", False, None), (b"a", b"b", "int64", False, None)])
    with pytest.raises(ValueError, match="same JSON key"):
        plan_type([(b"a", b"k", "int64", False, None), (b"b", b"k", "int64", False, None)])
    with pytest.raises(ValueError, match="at least one"):
        plan_type([])
    with pytest.raises(TypeError):
        plan_type([("a", b"a", "int64", False, None)])
    plan = plan_type([(b"a", b"a", "int64", False, None)])
    with pytest.raises(TypeError, match="initialized once"):
        plan.__init__([(b"b", b"b", "int64", False, None)])
    assert plan.features == ((b"a", b"a", "int64", False, None),)
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.features == plan.features
    assert copy.encode_batch([b'{"a": 5}']) == plan.encode_batch([b'{"a": 5}']) != [None]


# --- what the fast path writes ------------------------------------------------------------------


def test_typical_events_take_the_fast_path() -> None:
    schema = ExampleSchema(MOVIE_FEATURES)
    lines = movie_lines(3000, 7)
    out = check(schema, lines)
    assert None not in out
    first = out[0]
    assert first is not None
    assert proto.parse_example(first) == proto.parse_example(schema.encode(orjson.loads(lines[0])))


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_in_whole_seconds_take_the_fast_path(unit: str) -> None:
    features: dict[str, Any] = {"ts": {"type": "int64", "time_unit": unit}, "v": "float"}
    assert ExampleSchema(features).compiled_json_features() is not None
    for seconds in (0, 1, -1, 1_764_000_000, -(2**30)):
        got = fast(features, b'{"ts": %d, "v": 1}' % seconds)
        assert proto.parse_example(got)["ts"] == [seconds * PER_SECOND[unit]]
    got = fast(features, b'{"ts": [1, 2], "v": 1}')
    assert proto.parse_example(got)["ts"] == [PER_SECOND[unit], 2 * PER_SECOND[unit]]


@pytest.mark.parametrize(
    "value",
    [
        b'"2026-11-24T03:00:00Z"',  # RFC 3339: Python's
        b"1.5",  # a fraction: floored by Python, exactly
        b"1e3",  # an exponent
        b"9223372036854775",  # whole seconds whose count of nanoseconds is past int64
        b"true",
        b'["2026-11-24T03:00:00Z"]',
    ],
)
def test_timestamps_python_converts_fall_back(value: bytes) -> None:
    features = {"ts": {"type": "int64", "time_unit": "ns"}}
    assert falls_back(features, b'{"ts": %s}' % value)


def test_records_parse_to_the_values() -> None:
    features = {
        "i": "int64",
        "f": "float",
        "b": "bytes",
        "empty": "float",
        "gone": "int64",
        "dflt": {"type": "bytes", "default": ["x", "y"]},
        "renamed": {"type": "int64", "path": "src"},
    }
    payload = (
        b' {"b": ["caf\\u00e9", "\\ud83d\\ude00\\n", "\xc3\xa9"], "i": [-1, 0, 9223372036854775807,'
        b' -9223372036854775808, -0], "f": 0.1, "empty": [], "gone": null, "src": 7,'
        b' "junk": {"a": [1, {"b": null}], "c": true}} \n'
    )
    parsed = proto.parse_example(fast(features, payload))
    assert parsed == {
        "b": [b"caf\xc3\xa9", "\U0001f600\n".encode(), b"\xc3\xa9"],
        "i": [-1, 0, 2**63 - 1, -(2**63), 0],
        "f": [struct.unpack("<f", struct.pack("<f", 0.1))[0]],
        "empty": [],
        "dflt": [b"x", b"y"],
        "renamed": [7],
    }


@pytest.mark.parametrize(
    ("features", "payload"),
    [
        ({"a": "int64"}, b"{}"),  # a missing optional feature is left out
        ({"a": "int64"}, b'{"a":null}'),
        ({"a": {"type": "int64", "default": 3}}, b'{"a":null}'),
        ({"a": {"type": "int64", "default": [3, 4]}}, b"{}"),
        ({"a": {"type": "int64", "required": True}}, b'{"a":[]}'),
        ({"a": "float"}, b'{"a":[1, -0, -0.0, 2.5e-3, 1E2, 1e+2, 0e400, 16777217]}'),
        ({"a": "float"}, b'{"a":-9223372036854775808}'),
        ({"a": "float"}, b'{"a":0.12345678901234567890123}'),  # needs the exact slow path
        ({"a": "float"}, b'{"a":1e-400}'),
        ({"a": "float"}, b'{"a":3.4028235677973362e38}'),
        ({"a": "bytes"}, b'{"a":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u0000\\u007f\x7f"}'),
        ({"a": "bytes"}, '{"a":"\U0010ffff\u0800\u07ff"}'.encode()),
        ({"a": "bytes"}, b'{"\\u0061":"escaped key"}'),
        ({"a": "bytes"}, b'{"b":"\\u00e9", "c": [9.9e307, -1.5, 0], "d": {}}'),
        ({"a": "bytes", "b": "int64"}, b'\t\r\n {\t"a"\n:\r"x" , "b" :1 }\t\r\n'),
        ({"a": "bytes"}, b'{"a":"' + b"x" * 20000 + b'"}'),
        ({"a": "int64"}, b'{"a":[' + b",".join(b"300" for _ in range(5000)) + b"]}"),
        ({"a": "int64"}, b'{"x":' + b"[" * 63 + b"]" * 63 + b"}"),
        # Integers written with a fraction or an exponent: the number the text says, exactly.
        ({"a": "int64"}, b'{"a":[1.0, 2e0, 2.50e1, 9007199254740993.0, -0.0, 0e999, 1E+2]}'),
        ({"a": "int64"}, b'{"a":[-9223372036854775808.0, 92233720368547758070e-1]}'),
        ({"a": "int64"}, b'{"a":0.00000000000000000000000000001e29}'),
    ],
)
def test_unusual_but_plain_events_take_the_fast_path(
    features: dict[str, Any], payload: bytes
) -> None:
    fast(features, payload)


@pytest.mark.parametrize(
    ("features", "payload"),
    [
        ({"a": "int64"}, b""),
        ({"a": "int64"}, b"   "),
        ({"a": "int64"}, b"[]"),
        ({"a": "int64"}, b'"a"'),
        ({"a": "int64"}, b"\xef\xbb\xbf{}"),  # a BOM
        ({"a": "int64"}, b"{}x"),
        ({"a": "int64"}, b"{}\x0c"),  # form feed is not JSON whitespace
        ({"a": "int64"}, b"{}{}"),
        ({"a": "int64"}, b'{"a":1,}'),
        ({"a": "int64"}, b'{"a":1 "b":2}'),
        ({"a": "int64"}, b'{"a":1,"a":2}'),  # a duplicated feature key
        ({"a": "int64"}, b'{"a":1,"\\u0061":2}'),
        ({"a": "int64"}, b'{"a":01}'),
        ({"a": "int64"}, b'{"a":1.5}'),
        ({"a": "int64"}, b'{"a":1.0000000000000001}'),  # 1.0 as a double; not an integer
        ({"a": "int64"}, b'{"a":9223372036854775808.0}'),
        ({"a": "int64"}, b'{"a":-92233720368547758090e-1}'),
        ({"a": "int64"}, b'{"a":1e19}'),
        ({"a": "int64"}, b'{"a":1e-1}'),
        ({"a": "int64"}, b'{"a":10000000000000000000000e-3}'),  # more than 19 digits
        ({"a": "int64"}, b'{"a":9223372036854775808}'),
        ({"a": "int64"}, b'{"a":-9223372036854775809}'),
        ({"a": "int64"}, b'{"a":true}'),
        ({"a": "int64"}, b'{"a":[1,null]}'),
        ({"a": "int64"}, b'{"a":[[1]]}'),
        ({"a": "int64"}, b'{"a":{}}'),
        ({"a": "int64"}, b'{"a":"1"}'),
        ({"a": {"type": "int64", "required": True}}, b"{}"),
        ({"a": {"type": "int64", "required": True}}, b'{"a":null}'),
        ({"a": "float"}, b'{"a":3.4028235677973366e38}'),  # float32 overflow
        ({"a": "float"}, b'{"a":1e39}'),
        ({"a": "float"}, b'{"a":1e400}'),
        ({"a": "float"}, b'{"a":NaN}'),
        ({"a": "float"}, b'{"a":Infinity}'),
        ({"a": "float"}, b'{"a":false}'),
        ({"a": "float"}, b'{"a":9223372036854775808}'),  # int beyond int64 for a float
        ({"a": "float"}, b'{"a":1.}'),
        ({"a": "float"}, b'{"a":.5}'),
        ({"a": "float"}, b'{"a":+1}'),
        ({"a": "float"}, b'{"a":1e}'),
        ({"a": "float"}, b'{"a":-}'),
        ({"a": "bytes"}, b'{"a":1}'),
        ({"a": "bytes"}, b'{"a":"\\ud800"}'),  # lone surrogates
        ({"a": "bytes"}, b'{"a":"\\udc00"}'),
        ({"a": "bytes"}, b'{"a":"\\ud800\\u0041"}'),
        ({"a": "bytes"}, b'{"a":"\\x"}'),
        ({"a": "bytes"}, b'{"a":"\\u00g0"}'),
        ({"a": "bytes"}, b'{"a":"\x01"}'),  # a raw control character
        ({"a": "bytes"}, b'{"a":"\x1f"}'),
        ({"a": "bytes"}, b'{"a\x00":"x"}'),
        ({"a": "bytes"}, b'{"a":"\xe0\x80\x80"}'),  # overlong three- and four-byte forms
        ({"a": "bytes"}, b'{"a":"\xf0\x80\x80\x80"}'),
        ({"a": "bytes"}, b'{"a":"\xff"}'),
        ({"a": "bytes"}, b'{"a":"\xc0\x80"}'),  # an overlong form
        ({"a": "bytes"}, b'{"a":"\xed\xa0\x80"}'),  # a surrogate in UTF-8
        ({"a": "bytes"}, b'{"a":"\xf4\x90\x80\x80"}'),  # above U+10FFFF
        ({"a": "bytes"}, b'{"a":"\xe2\x82"}'),  # truncated
        ({"a": "bytes"}, b'{"a":"x}'),
        ({"a": "bytes"}, b'{"b":"\xff"}'),  # invalid UTF-8 in a value that is skipped
        ({"a": "bytes"}, b'{"b":1e400}'),  # orjson refuses an infinite double anywhere
        ({"a": "bytes"}, b'{"b":' + b"1" * 400 + b"}"),
        ({"a": "bytes"}, b'{"b":[1,]}'),
        ({"a": "bytes"}, b'{"b":tru}'),
        ({"a": "bytes"}, b'{"b":' + b"[" * 64 + b"]" * 64 + b"}"),  # deeper than 64
        ({"a": "bytes"}, b"{'a':'x'}"),
    ],
)
def test_anything_unusual_falls_back(features: dict[str, Any], payload: bytes) -> None:
    assert falls_back(features, payload)


def test_utf8_validation_at_every_boundary() -> None:
    """Strings with every lead byte and continuation bytes at the edges of the valid ranges:
    whatever the compiled path takes, Python takes too, and it takes all valid UTF-8."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    sequences = [bytes([lead]) for lead in range(0x20, 0x100)]
    sequences += [bytes([lead, b]) for lead in range(0x80, 0x100) for b in edges]
    sequences += [bytes([lead, b, c]) for lead in range(0xE0, 0x100) for b in edges for c in edges]
    sequences += [
        bytes([lead, b, 0x80, c]) for lead in range(0xF0, 0x100) for b in edges for c in edges
    ]
    payloads = [b'{"a":"' + seq + b'x"}' for seq in sequences]
    out = check(ExampleSchema({"a": "bytes"}), payloads)
    for seq, got in zip(sequences, out, strict=True):
        valid = True
        try:
            seq.decode("utf-8")
        except UnicodeDecodeError:
            valid = False
        valid = valid and seq not in (b'"', b"\\") and not any(b < 0x20 for b in seq)
        assert (got is not None) == valid, seq


def test_payloads_that_are_not_bytes_fall_back() -> None:
    plan = plan_for(ExampleSchema({"a": "int64"}))
    assert plan.encode_batch([bytearray(b'{"a":1}'), memoryview(b'{"a":1}'), None, b'{"a":1}'])[
        :3
    ] == [None, None, None]
    assert plan.encode_batch([]) == []


# --- numbers, against orjson and struct ---------------------------------------------------------

NUMBER = st.from_regex(
    r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True
)


@given(st.lists(NUMBER, min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_number_tokens_match_orjson_and_struct(tokens: list[str]) -> None:
    for token in tokens:
        try:
            value = orjson.loads(token)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, float) and any(c in token for c in ".eE"):
            # orjson's double is float()'s (the compiled path relies on it), sign of zero included.
            assert struct.pack("<d", value) == struct.pack("<d", float(token)), token
        elif -(2**63) <= int(token) < 2**64:
            assert value == int(token), token
    payloads = [f'{{"f": {t}, "i": {t}}}'.encode() for t in tokens]
    payloads += [f'{{"f": [{", ".join(tokens)}]}}'.encode()]
    out = check(ExampleSchema({"f": "float", "i": "int64"}), payloads)
    out += check(ExampleSchema({"f": "float"}), payloads)


@given(st.lists(st.one_of(st.floats(), st.floats(width=32), st.sampled_from(FLOAT32_EDGE))))
@settings(max_examples=200, deadline=None)
def test_floats_written_as_python_writes_them(values: list[float]) -> None:
    texts = [repr(v) for v in values] + [f"{v:.17e}" for v in values if math.isfinite(v)]
    schema = ExampleSchema({"f": "float"})
    payloads = [f'{{"f": {t}}}'.encode() for t in texts]
    payloads.append(json.dumps({"f": values}).encode())
    out = check(schema, payloads)
    for text, got in zip(texts, out, strict=False):
        # A finite double that fits a float32 must take the fast path.
        v = float(text)
        try:
            struct.pack("<f", v)
        except OverflowError:
            continue
        if math.isfinite(v):
            assert got is not None, text


@given(st.lists(st.integers(min_value=-(2**64), max_value=2**64), max_size=5))
@settings(max_examples=200, deadline=None)
def test_ints_written_as_python_writes_them(values: list[int]) -> None:
    schema = ExampleSchema({"i": "int64", "f": "float"})
    payloads = [json.dumps({"i": v, "f": v}).encode() for v in values]
    payloads.append(json.dumps({"i": values, "f": values}).encode())
    out = check(schema, payloads)
    for v, got in zip(values, out, strict=False):
        assert (got is not None) == (-(2**63) <= v < 2**63), v


# --- random schemas and events ------------------------------------------------------------------

KEY_ALPHABET = "abcé😀_\u0000\"\\'"
KINDS = ["int64", "float", "bytes", "ts"]
"""Feature kinds of the generated schemas; ``ts`` is an int64 with a ``time_unit``."""
UNITS = ["s", "ms", "us", "ns"]

scalar_json = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
junk_json = st.recursive(
    scalar_json,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def element(kind: str) -> st.SearchStrategy[Any]:
    if kind == "int64":
        return st.one_of(
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.integers(min_value=-300, max_value=300),
        )
    if kind == "ts":
        return st.one_of(
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.integers(min_value=-(10**10), max_value=10**10),
            st.floats(min_value=-1e10, max_value=1e10),
            st.datetimes().map(lambda t: t.isoformat() + "Z"),
            st.text(max_size=4),
        )
    if kind == "float":
        return st.one_of(
            st.floats(allow_nan=False, allow_infinity=False, width=32),
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from(FLOAT32_EDGE),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
        )
    return st.text(max_size=8)


def feature_value(kind: str) -> st.SearchStrategy[Any]:
    good = element(kind)
    return st.one_of(
        good,
        st.lists(good, max_size=5),
        st.lists(st.one_of(good, scalar_json), max_size=3),  # the odd wrong element
        junk_json,
    )


@st.composite
def schemas(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    """(features, feature name → the JSON key it reads)."""
    names = draw(
        st.lists(st.text(KEY_ALPHABET, min_size=1, max_size=3), min_size=1, max_size=5, unique=True)
    )
    features: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for name in names:
        kind = draw(st.sampled_from(KINDS))
        spec: dict[str, Any] = {"type": kind}
        if kind == "ts":
            spec = {"type": "int64", "time_unit": draw(st.sampled_from(UNITS))}
        mode = draw(st.sampled_from(["plain", "required", "default", "renamed"]))
        if mode == "required":
            spec["required"] = True
        elif mode == "default":
            spec["default"] = draw(
                {
                    "int64": st.integers(-(2**63), 2**63 - 1),
                    "float": st.just(2.5),
                    "ts": st.integers(-(10**9), 10**9),
                }.get(kind, st.text(max_size=3))
            )
        elif mode == "renamed" and "." not in name and "[" not in name and "]" not in name:
            spec["path"] = "k" + name
        key = spec.get("path", name)
        if key in keys.values():
            continue
        features[name] = spec
        keys[name] = key
    return features, keys


def dumps_variants(value: Any) -> list[str]:
    out = [json.dumps(value, ensure_ascii=True), json.dumps(value, ensure_ascii=False)]
    with contextlib.suppress(TypeError):  # an int beyond 64 bits
        out.append(orjson.dumps(value).decode())
    return out


def object_text(draw: st.DrawFn, pairs: list[tuple[str, Any]]) -> bytes:
    """A JSON object of ``pairs`` (duplicates kept), written by hand with odd whitespace."""
    ws = st.sampled_from(["", " ", "\n", "\t", "\r\n ", "  "])
    parts = []
    for key, value in pairs:
        key_text = json.dumps(key, ensure_ascii=draw(st.booleans()))
        value_text = draw(st.sampled_from(dumps_variants(value)))
        parts.append(f"{draw(ws)}{key_text}{draw(ws)}:{draw(ws)}{value_text}{draw(ws)}")
    return f"{draw(ws)}{{{','.join(parts)}}}{draw(ws)}".encode()


class Case:
    """A schema, the kind of value each JSON key holds, and payloads: ``clean`` ones written by a
    JSON library from one object (no duplicate keys), ``others`` written by hand."""

    def __init__(self, schema: ExampleSchema, kinds: dict[str, str]) -> None:
        self.schema = schema
        self.kinds = kinds
        self.clean: list[bytes] = []
        self.others: list[bytes] = []

    def __repr__(self) -> str:
        return f"Case({self.schema.features!r}, {self.clean!r}, {self.others!r})"


@st.composite
def cases(draw: st.DrawFn) -> Case:
    features, keys = draw(schemas())
    kinds = {n: "ts" if "time_unit" in spec else spec["type"] for n, spec in features.items()}
    case = Case(ExampleSchema(features), {keys[n]: kinds[n] for n in features})
    for _ in range(draw(st.integers(1, 6))):
        event: dict[str, Any] = {}
        pairs: list[tuple[str, Any]] = []
        for name in features:
            kind = kinds[name]
            choice = draw(
                st.sampled_from(["good", "good", "good", "list", "other", "none", "miss"])
            )
            if choice == "miss":
                continue
            if choice == "good":
                value = draw(element(kind))
            elif choice == "list":
                value = draw(st.lists(element(kind), max_size=5))
            elif choice == "none":
                value = None
            else:
                value = draw(feature_value(kind))
            event[keys[name]] = value
            pairs.append((keys[name], value))
        extra = draw(st.dictionaries(st.text(KEY_ALPHABET, max_size=3), junk_json, max_size=4))
        for key, value in extra.items():
            if key not in event:
                event[key] = value
                pairs.append((key, value))
        case.clean.extend(text.encode() for text in dumps_variants(event))
        duplicate = draw(st.booleans())
        if pairs and duplicate:
            pairs.insert(draw(st.integers(0, len(pairs))), draw(st.sampled_from(pairs)))
        case.others.append(object_text(draw, draw(st.permutations(pairs))))
    return case


def mutations(payload: bytes, rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(6):
        i = rng.randrange(len(payload) + 1)
        out.append(payload[:i])
        if i < len(payload):
            flipped = payload[i] ^ (1 << rng.randrange(8))
            out.append(payload[:i] + bytes([rng.randrange(256)]) + payload[i + 1 :])
            out.append(payload[:i] + bytes([flipped]) + payload[i + 1 :])
            out.append(payload[:i] + payload[i + 1 :])
        junk = rng.choice(
            [b" ", b"\t", b",", b"x", b"\x00", b"]", b"}", b'"', b"\\", b"\xc3", b"-"]
        )
        out.append(payload[:i] + junk + payload[i:])
    return out


@given(cases(), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_schemas_and_events(case: Case, rng: random.Random) -> None:
    plan = plan_for(case.schema)
    payloads = case.clean + case.others
    check(case.schema, payloads, plan)
    check(case.schema, [m for p in payloads for m in mutations(p, rng)], plan)


@given(cases())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_valid_events_of_random_schemas_take_the_fast_path(case: Case) -> None:
    out = check(case.schema, case.clean)
    for payload, got in zip(case.clean, out, strict=True):
        if got is None and python_path(case.schema, payload) is not None:
            # The compiled path may decline only what it documents as declined. The event is
            # read as written: orjson would turn an integer beyond 64 bits into a float.
            event = json.loads(payload)
            units = {
                key: spec.time_unit for key, spec in _keys_of(case.schema).items() if spec.time_unit
            }
            assert any(
                _declined(case.kinds.get(k), v, PER_SECOND[units[k]] if k in units else 1)
                for k, v in event.items()
            ), payload


def _keys_of(schema: ExampleSchema) -> dict[str, Any]:
    """Each JSON key the schema reads → the spec of its feature."""
    return {spec.path or name: spec for name, spec in schema.features.items()}


def _declined(kind: str | None, value: Any, per_second: int = 1) -> bool:
    """Whether the compiled path leaves a key's value to Python although Python writes it."""
    if _has_huge_float(value):  # at or beyond 1e308: might be infinite as a double
        return True
    values = value if isinstance(value, list) else [value]
    if kind == "ts":
        # Only whole seconds written as an integer whose count of the unit fits an int64.
        return any(not isinstance(v, int) or not -(2**63) <= v * per_second < 2**63 for v in values)
    if kind == "int64":
        # A float here was written with a fraction or an exponent: the compiled path takes it
        # only when it reads an int64 from the digits as easily as Python does.
        return any(isinstance(v, float) for v in values)
    if kind == "float":
        return any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in values)
    return False


def _has_huge_float(value: Any) -> bool:
    if isinstance(value, float):
        return abs(value) >= 1e308
    if isinstance(value, list):
        return any(_has_huge_float(v) for v in value)
    if isinstance(value, dict):
        return any(_has_huge_float(v) for v in value.values())
    return False


# --- the encoder --------------------------------------------------------------------------------


def mixed_batch() -> list[RawEvent]:
    lines = movie_lines(40, 3)
    events = [RawEvent(line, f"test:{i}") for i, line in enumerate(lines)]
    events[3] = RawEvent(b'{"user": "u", "age": 1.5}', "test:3")  # a schema failure
    events[5] = RawEvent(b'{"user": "u", "age": ', "test:5")  # malformed
    events[7] = RawEvent(b'{"user": "u", "age": 3.0}', "test:7")  # Python converts, C declines
    events[9] = RawEvent(b"", "test:9", {"user": "v", "age": 4})  # already structured
    events[11] = RawEvent(b"v,5", "test.csv:2", {"user": "v", "age": "5"}, "csv")
    events[13] = RawEvent(b"\x89PNG", "spool/x.png", {"filename": "x.png"}, "file")
    events[15] = RawEvent(b"[1, 2]", "test:15")  # not an object
    events[17] = RawEvent(b'{"age": 99999999999999999999}', "test:17")
    events[19] = RawEvent(b'{"movie_ratings": [1e39]}', "test:19")
    events[21] = RawEvent(b'{"user": "\\ud800"}', "test:21")
    return events


def test_encoder_results_are_the_same_with_and_without_the_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = ExampleEncoderConfig.model_validate({"features": MOVIE_FEATURES})
    compiled = config.build()
    assert compiled.plan is not None
    events = mixed_batch()
    got = compiled.encode_batch(events)
    monkeypatch.setattr(speedups, "load", lambda name: None)
    pure = config.build()
    assert pure.plan is None
    expected = pure.encode_batch(events)
    assert got == expected
    assert len(got.records) + len(got.failures) == len(events)
    assert [i for i, _, _ in got.failures] == [3, 5, 13, 15, 17, 19, 21]
    all_good = [RawEvent(line, "t") for line in movie_lines(50, 4)]
    assert compiled.encode_batch(all_good) == pure.encode_batch(all_good)
    assert compiled.encode_batch([]) == EncodeResult()


def test_ineligible_schema_uses_the_python_path() -> None:
    config = ExampleEncoderConfig.model_validate(
        {"features": {"age": {"type": "int64", "path": "user.age"}}}
    )
    encoder = config.build()
    assert encoder.plan is None
    result = encoder.encode_batch([RawEvent(b'{"user": {"age": 3}}', "t")])
    assert proto.parse_example(result.records[0]) == {"age": [3]}


def test_batches_encode_the_same_from_several_threads() -> None:
    schema = ExampleSchema(MOVIE_FEATURES)
    plan = plan_for(schema)
    lines = movie_lines(2000, 5) + [b'{"movie_ratings": [0.123456789012345678]}'] * 50
    expected = plan.encode_batch(lines)
    results: list[list[bytes | None]] = []

    def work() -> None:
        for _ in range(5):
            results.append(plan.encode_batch(lines))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    assert all(r == expected for r in results)


# --- string_groups: a batch grouped by a route's field ----------------------------------------


@st.composite
def routed_payloads(draw: st.DrawFn) -> tuple[str, list[bytes], list[bytes]]:
    """(the route's key, payloads written by a JSON library, payloads written by hand: keys
    repeated, odd whitespace)."""
    key = draw(st.text(KEY_ALPHABET, min_size=1, max_size=3))
    clean: list[bytes] = []
    others: list[bytes] = []
    for _ in range(draw(st.integers(1, 5))):
        value = draw(st.one_of(st.text(max_size=6), junk_json))
        event = draw(st.dictionaries(st.text(KEY_ALPHABET, max_size=3), junk_json, max_size=4))
        if draw(st.booleans()):
            event[key] = value
        clean.extend(text.encode() for text in dumps_variants(event))
        pairs: list[tuple[str, Any]] = list(event.items())
        repeat: bool = draw(st.booleans())
        if pairs and repeat:
            repeated: str = draw(st.text(max_size=3))
            pairs.insert(draw(st.integers(0, len(pairs))), (key, repeated))
        shuffled: list[tuple[str, Any]] = draw(st.permutations(pairs))
        others.append(object_text(draw, shuffled))
    return key, clean, others


def check_groups(key: str, payloads: list[bytes], values: list[str]) -> list[int]:
    """Hold every compiled grouping to Python's reading of the route's field: each payload in
    exactly one group, in order, and in the group of the value Python reads (the first of a
    value given twice), or in "another string", or left to Python. Return the unread."""
    assert cexample is not None
    groups: list[list[int]] = cexample.string_groups(
        payloads, key.encode(), [v.encode() for v in values]
    )
    assert len(groups) == len(values) + 2
    assert sorted(i for g in groups for i in g) == list(range(len(payloads)))
    assert all(g == sorted(g) for g in groups)
    for j, group in enumerate(groups[: len(values)]):
        for i in group:
            assert route_value(RawEvent(payloads[i], "t:1"), key) == values[j], payloads[i]
            assert values.index(values[j]) == j
    for i in groups[-2]:
        value = route_value(RawEvent(payloads[i], "t:1"), key)
        assert isinstance(value, str), payloads[i]
        assert value not in values, payloads[i]
    return groups[-1]


@given(
    routed_payloads(), st.lists(st.text(max_size=3), max_size=12), st.randoms(use_true_random=False)
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_string_groups_agree_with_python(
    case: tuple[str, list[bytes], list[bytes]], extra: list[str], rng: random.Random
) -> None:
    key, clean, others = case
    payloads = clean + others
    read = [route_value(RawEvent(p, "t:1"), key) for p in payloads]
    # The values asked about: some that occur (one twice), some that do not; over
    # LINEAR_VALUES (8) of them the C side looks them up in a dict.
    values = [v for v in read if v is not None][:3] + extra + [v for v in read if v][:1]
    check_groups(key, payloads, values)
    check_groups(key, [m for p in payloads for m in mutations(p, rng)], values)
    unread = check_groups(key, clean, values)
    for i in unread:
        event = json.loads(clean[i])
        # A plain string takes the compiled path. Left to Python: escapes (a key or value
        # written with them), and a number at or beyond 1e308 elsewhere, which the compiled
        # scanner leaves to Python as it does for the encoder.
        assert not isinstance(event.get(key), str) or b"\\" in clean[i] or _has_huge_float(event), (
            clean[i]
        )


def test_string_groups_leave_the_unsure_to_python() -> None:
    assert cexample is not None
    payloads = [
        b'{"type": "click", "x": [1, {"y": null}]}',
        b'{"t\\u0079pe": "click"}',
        b'{"type": 1}',
        b'{"type": "a", "type": "b"}',
        b'{"x": 1}',
        b'{"type": "click"',
        b'["type", "click"]',
        b'{"type": "\\ud800"}',
        b'{"type": "view"}',
        b'{"type": "cl\\u0069ck"}',
        b'{"type": "other"}',
    ]
    click, view, other, unread = cexample.string_groups(
        [*payloads, None], b"type", [b"click", b"view"]
    )
    assert (click, view, other) == ([0, 1], [8], [10])  # a key with escapes is read too
    assert unread == [2, 3, 4, 5, 6, 7, 9, 11]
    with pytest.raises(TypeError):
        cexample.string_groups(payloads, "type", [])
    with pytest.raises(TypeError):
        cexample.string_groups(payloads, b"type", ["click"])
