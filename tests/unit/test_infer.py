"""Features inferred from a sample (``tfrecordd schema --infer``): each choice, its reason, the
TOML it prints, and the property that the example encoder takes every sampled line by them."""

from __future__ import annotations

import csv
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from tfrecordd.events import RawEvent
from tfrecordd.schema.infer import Inference, InferenceError, infer, read_text
from tfrecordd.schema.infer_toml import propose, render_toml
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig


def lines(*events: Any) -> str:
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)


def table(inf: Inference) -> dict[str, Any]:
    """The features of the TOML printed for ``inf``, as a config loads them."""
    parsed = tomllib.loads(render_toml(inf, "t", propose(inf)))
    features: dict[str, Any] = parsed["encoders"]["t"]["features"]
    return features


def jsonl(*events: Any) -> dict[str, Any]:
    return table(read_text(lines(*events), "jsonl"))


def left_out(inf: Inference) -> dict[str, str]:
    return {p.name: p.reasons[0] for p in propose(inf) if p.spec is None}


def test_types_required_and_shapes() -> None:
    features = jsonl(
        {"id": 1, "name": "a", "score": 1.5, "tags": ["x"], "pos": [1, 2], "opt": 3},
        {"id": 2, "name": "b", "score": 2, "tags": ["y", "z"], "pos": [3.5, 4], "opt": None},
    )
    assert features == {
        "id": {"type": "int64", "required": True, "shape": []},
        "name": {"type": "bytes", "required": True, "shape": []},
        "score": {"type": "float", "required": True, "shape": []},
        "tags": {"type": "bytes", "required": True},
        "pos": {"type": "float", "required": True, "shape": [2]},
        "opt": "int64",
    }


def test_shape_only_where_every_line_has_the_same_nonzero_count() -> None:
    features = jsonl({"a": [1, 2], "b": [], "c": 1}, {"a": [3, 4], "b": [], "c": [1]}, {"d": [1]})
    # "a" is missing from the third line: not required, so no shape (as TFDV: presence 100%)
    assert features["a"] == "int64"
    assert features["b"] == "bytes"  # only empty lists: any type takes them
    assert features["c"] == "int64"  # one value here, a list there
    features = jsonl({"m": [[1, 2, 3], [4, 5, 6]]}, {})
    assert features["m"] == {"type": "int64", "shape": [2, 3]}  # a nested list needs its shape


def test_timestamps() -> None:
    inf = read_text(
        lines(
            {"at": "2026-11-27T16:53:19Z", "ts": 1_700_000_000, "t_ms": 1_700_000_000_123},
            {"at": "2026-11-27T16:53:19.25+01:00", "ts": 1_700_000_001, "t_ms": 1_700_000_000_124},
            {"at": "2026-11-27T16:53:19.123456Z", "ts": 1_700_000_002.5, "t_ms": 1_700_000_000_125},
        ),
        "jsonl",
    )
    features = table(inf)
    assert features["at"] == {"type": "int64", "time_unit": "us", "required": True, "shape": []}
    assert features["ts"] == {"type": "int64", "time_unit": "ms", "required": True, "shape": []}
    # epoch milliseconds stay as they are: time_unit reads numbers as seconds
    assert features["t_ms"] == {"type": "int64", "required": True, "shape": []}
    text = render_toml(inf, "t", propose(inf))
    assert '# int64 time_unit "us": RFC 3339 timestamps, fractions of up to 6 digits' in text
    assert "epoch milliseconds" in text
    # a number in the epoch range under another name is a number
    assert jsonl({"count": 1_700_000_000})["count"]["type"] == "int64"
    assert "time_unit" not in jsonl({"count": 1_700_000_000})["count"]


def test_numbers_beyond_int64_and_mixed_kinds() -> None:
    inf = read_text(
        lines(
            {"big": 2**64, "mix": 1, "flag": True, "objs": [{"a": 1}], "huge": 1e300},
            {"big": 3, "mix": "one", "flag": False, "objs": [], "huge": 1},
        ),
        "jsonl",
    )
    assert table(inf)["big"]["type"] == "float"
    assert "beyond int64" in render_toml(inf, "t", propose(inf))
    out = left_out(inf)
    assert set(out) == {"mix", "flag", "objs", "huge"}
    assert "true/false" in out["flag"]
    assert "numbers in some lines and strings in others" in out["mix"]
    assert "list of objects" in out["objs"]
    assert "float32" in out["huge"]


def test_nested_objects_become_paths() -> None:
    inf = read_text(
        lines(
            {"user": {"age": 3, "name": "a", "geo": {"lat": 1.5}}, "odd": {"x": 1}},
            {"user": {"age": 4, "geo": {"lat": 2}}, "odd": 7},
        ),
        "jsonl",
    )
    features = table(inf)
    assert features["user.age"] == {
        "type": "int64",
        "path": "user.age",
        "required": True,
        "shape": [],
    }
    assert features["user.geo.lat"]["path"] == "user.geo.lat"
    assert features["user.name"] == {"type": "bytes", "path": "user.name"}
    assert set(left_out(inf)) == {"odd", "odd.x"}


def test_lines_that_do_not_fit_are_listed_with_their_numbers() -> None:
    text = lines({"a": 1}, "not json", "[1, 2]", "", "7", {"a": 2}) + "{}\n" * 30 + "nope\n" * 30
    inf = read_text(text, "jsonl", name="in.jsonl")
    assert inf.records == 32
    assert inf.misfit_count == 33
    assert [(m.line, m.reason.split(":")[0]) for m in inf.misfits[:3]] == [
        (2, "not JSON"),
        (3, "not an object"),
        (5, "not an object"),
    ]
    assert len(inf.misfits) == 20
    printed = render_toml(inf, "t", propose(inf))
    assert "# 33 lines did not fit; the daemon dead-letters them (the first 20 below):" in printed
    assert "#   in.jsonl:2: not JSON" in printed


def test_csv() -> None:
    text = (
        "id,name,price,when,big,mixed\n"
        "1,ada,1.5,2026-01-01T00:00:00Z,99999999999999999999,1\n"
        '2,"b,c",,2026-01-01T00:00:00.5Z,3,x\n'
        "3,d\n"
        "4,e,2,2026-01-01T00:00:01Z,4,2\n"
    )
    inf = read_text(text, "csv", name="in.csv")
    assert [(m.line, m.reason) for m in inf.misfits] == [(4, "2 fields, the header 6")]
    features = table(inf)
    assert features == {
        "id": {"type": "int64", "required": True, "shape": []},
        "name": {"type": "bytes", "required": True, "shape": []},
        "price": "float",
        "when": {"type": "int64", "time_unit": "ms", "required": True, "shape": []},
        "big": {"type": "bytes", "required": True, "shape": []},
        "mixed": {"type": "bytes", "required": True, "shape": []},
    }


def test_keys_are_quoted_and_comments_hold_no_control_characters() -> None:
    inf = read_text(lines({'we"ird\u007f': 1, "new\nline": "x", "ok-key_1": 2}), "jsonl")
    text = render_toml(inf, "my encoder", propose(inf))
    parsed = tomllib.loads(text)
    assert set(parsed["encoders"]["my encoder"]["features"]) == {
        'we"ird\u007f',
        "new\nline",
        "ok-key_1",
    }
    assert "\nok-key_1 = " in text


def test_files_sampled_and_formats(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(lines(*({"i": i} for i in range(50))))
    inf = infer([str(path)], sample=10)
    assert (inf.records, inf.files) == (10, [(str(path), 10, False)])
    inf = infer([str(path)])
    assert inf.files == [(str(path), 50, True)]
    other = tmp_path / "events.txt"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(InferenceError, match=r"give --format jsonl\|csv"):
        infer([str(other)])
    assert infer([str(other)], "csv").records == 1
    with pytest.raises(InferenceError, match="together"):
        infer([str(path), str(tmp_path / "x.csv")])


def test_a_header_naming_a_column_twice_is_refused() -> None:
    with pytest.raises(InferenceError, match="names 'a' twice"):
        read_text("a,a\n1,2\n", "csv")


# The property: whatever the records, the features inferred from them take every one.

_SCALARS = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(max_size=5)
    | st.sampled_from(["2026-11-27T16:53:19Z", "1999-01-01T00:00:00.123456789+05:30"])
    | st.integers(946_684_800, 4_102_444_800)  # epoch seconds, for fields named like a time
    | st.floats(946_684_800, 4_102_444_800)
    | st.integers(946_684_800_000, 4_102_444_800_000)
    | st.booleans()
    | st.none()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "ts"]), inner, max_size=3)
    ),
    max_leaves=8,
)
_EVENTS = st.lists(
    st.dictionaries(st.sampled_from(["id", "ts", "x", "y", "time", "n.m"]), _VALUES, max_size=5),
    min_size=1,
    max_size=8,
)


def encoder_of(inf: Inference) -> Any:
    features = table(inf)
    return ExampleEncoderConfig(type="example", features=features).build()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example([{"time": [946684800, 2**63]}])  # beyond int64: not epoch seconds
@given(_EVENTS)
def test_the_inferred_features_take_every_sampled_json_line(events: list[dict[str, Any]]) -> None:
    payloads = [json.dumps(e).encode() for e in events]
    inf = read_text("".join(p.decode() + "\n" for p in payloads), "jsonl")
    assert inf.misfit_count == 0
    if not any(p.spec is not None for p in propose(inf)):
        return  # nothing to declare: the command says so (tested with the CLI)
    result = encoder_of(inf).encode_lines(payloads)
    assert result.failures == []
    assert len(result.records) == len(events)


_FIELDS = st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00"), max_size=6) | (
    st.integers(-(2**70), 2**70).map(str)
    | st.floats(allow_nan=True, width=64).map(repr)
    | st.sampled_from(["2026-11-27T16:53:19.5Z", " 12 ", "1e39", "inf", "1700000000.25"])
    | st.integers(946_684_800, 4_102_444_800).map(str)
    | st.floats(946_684_800, 4_102_444_800).map(str)
)


@settings(max_examples=200, deadline=None)
@example([["", "INF", ""], ["", "946684800", ""]])  # inf is a float, never a time
@given(st.lists(st.lists(_FIELDS, min_size=3, max_size=3), min_size=1, max_size=8))
def test_the_inferred_features_take_every_sampled_csv_row(rows: list[list[str]]) -> None:
    header = ["id", "when", "v"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    inf = read_text(buf.getvalue(), "csv")
    assert inf.misfit_count == 0
    if not any(p.spec is not None for p in propose(inf)):
        return
    events = [
        RawEvent(b"", "", value=dict(zip(header, r, strict=True)), format="csv")
        for r in csv.reader(io.StringIO(buf.getvalue()))
    ][1:]
    result = encoder_of(inf).encode_batch(events)
    assert result.failures == []
    assert len(result.records) == len(rows)


def test_csv_is_split_as_the_directory_source_splits_it(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(
        b'\xef\xbb\xbf#TYPE Row\r\nid,note\r\n1,"two\r\nlines"\r\n2,x\r\n3\r\n\r\n4,\xff\r\n5,y\r\n'
    )
    inf = infer([str(path)])
    assert inf.records == 3  # the BOM, the preamble and the blank record skipped
    assert [(m.line, m.reason) for m in inf.misfits] == [
        (6, "1 field, the header 2"),
        (8, "not UTF-8 text, or longer than 1048576 bytes"),
    ]
    assert table(inf) == {
        "id": {"type": "int64", "required": True, "shape": []},
        "note": {"type": "bytes", "required": True, "shape": []},
    }
