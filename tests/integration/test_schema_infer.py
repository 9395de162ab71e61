"""``tfrecordd schema --infer``, the real command: the table it prints, pasted verbatim into a
config, makes a daemon write every event of the files it was inferred from, with their values.
And ``schema``'s exit statuses for what it cannot do."""

from __future__ import annotations

import csv
import json
import re
import struct
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.support import (
    dead_letters,
    read_examples,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    write_config,
    write_datasets_config,
)
from tfrecordd.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE

START = datetime(2026, 11, 27, 16, 0, tzinfo=UTC)
FAST = {"max_shard_age": "200ms"}
"""Shards published at once: a spool file is acknowledged once its records are."""


def f32(x: float) -> float:
    value: float = struct.unpack("<f", struct.pack("<f", x))[0]
    return value


def event(i: int) -> dict[str, Any]:
    at = START + timedelta(milliseconds=i * 1001)
    e: dict[str, Any] = {
        "id": i,
        "user": f"user-{i % 7}",
        "ts": f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond // 1000:03d}Z",
        "when": 1_764_000_000 + i,
        "geo": {"lat": i / 8, "lon": -i / 4},
        "pos": [i, i + 0.5],
        "tags": [f"t{j}" for j in range(i % 3)],
        "flag": i % 2 == 0,  # no feature type takes booleans: left out, the event still written
    }
    if i % 4:
        e["score"] = i * 1.25
    return e


def expected_ms(i: int) -> int:
    return int(START.timestamp()) * 1000 + i * 1001


def config_with(tmp_path: Path, table: str, source: dict[str, Any]) -> Path:
    """The helpers' config, its source using the encoder ``table`` declares (pasted verbatim)."""
    cfg = write_config(tmp_path, source={"encoder": "inferred"} | source, output=FAST)
    cfg.write_text(cfg.read_text() + "\n" + table)
    checked = run_tfrecordd("check-config", str(cfg))
    assert checked.returncode == EXIT_OK, checked.stderr
    return cfg


def test_infer_then_run_writes_every_json_event(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    events = [event(i) for i in range(90)]
    files = [spool_file(inputs, f"part-{k}.jsonl", events[k::3]) for k in range(3)]
    printed = run_tfrecordd("schema", "--infer", *map(str, files), "--name", "inferred")
    assert printed.returncode == EXIT_OK, printed.stderr
    features = tomllib.loads(printed.stdout)["encoders"]["inferred"]["features"]
    assert features == {
        "id": {"type": "int64", "required": True, "shape": []},
        "user": {"type": "bytes", "required": True, "shape": []},
        "ts": {"type": "int64", "time_unit": "ms", "required": True, "shape": []},
        "when": {"type": "int64", "time_unit": "s", "required": True, "shape": []},
        "geo.lat": {"type": "float", "path": "geo.lat", "required": True, "shape": []},
        "geo.lon": {"type": "float", "path": "geo.lon", "required": True, "shape": []},
        "pos": {"type": "float", "required": True, "shape": [2]},
        "tags": {"type": "bytes", "required": True},
        "score": "float",
    }
    assert "#   flag: holds true/false" in printed.stdout

    cfg = config_with(tmp_path, printed.stdout, {})
    for f in files:
        f.rename(tmp_path / "spool" / f.name)
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "spool"))
    assert dead_letters(tmp_path / "state") == []
    got = {int(ex["id"][0]): ex for ex in read_examples(tmp_path / "shards")}
    assert sorted(got) == list(range(90))
    for e in events:
        ex = got[e["id"]]
        assert ex["user"] == [e["user"].encode()]
        assert ex["ts"] == [expected_ms(e["id"])]
        assert ex["when"] == [e["when"]]
        assert ex["geo.lat"] == [f32(e["geo"]["lat"])]
        assert ex["geo.lon"] == [f32(e["geo"]["lon"])]
        assert ex["pos"] == [f32(x) for x in e["pos"]]
        assert ex.get("tags", []) == [t.encode() for t in e["tags"]]
        assert ex.get("score") == ([f32(e["score"])] if "score" in e else None)
        assert "flag" not in ex


def test_infer_then_run_writes_every_csv_row(tmp_path: Path) -> None:
    rows = [
        {
            "id": str(i),
            "name": f"n,{i}" if i % 5 else f'say "{i}"',
            "price": "" if i % 6 == 0 else f"{i * 0.5}",
            "created_at": f"2026-01-0{1 + i % 9}T12:00:00Z",
            "code": f"{i:03d}" if i % 2 else f"x{i}",
            "big": str(2**64 + i),
        }
        for i in range(60)
    ]
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    printed = run_tfrecordd("schema", "--infer", str(path), "--name", "inferred")
    assert printed.returncode == EXIT_OK, printed.stderr
    features = tomllib.loads(printed.stdout)["encoders"]["inferred"]["features"]
    assert features == {
        "id": {"type": "int64", "required": True, "shape": []},
        "name": {"type": "bytes", "required": True, "shape": []},
        "price": "float",
        "created_at": {"type": "int64", "time_unit": "s", "required": True, "shape": []},
        "code": {"type": "bytes", "required": True, "shape": []},
        "big": {"type": "bytes", "required": True, "shape": []},
    }

    cfg = config_with(tmp_path, printed.stdout, {"format": "csv", "pattern": "*.csv"})
    path.rename(tmp_path / "spool" / path.name)
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "spool"))
    assert dead_letters(tmp_path / "state") == []
    got = {int(ex["id"][0]): ex for ex in read_examples(tmp_path / "shards")}
    assert sorted(got) == list(range(60))
    for row in rows:
        ex = got[int(row["id"])]
        assert ex["name"] == [row["name"].encode()]
        assert ex.get("price") == ([f32(float(row["price"]))] if row["price"] else None)
        stamp = datetime.fromisoformat(row["created_at"].replace("Z", "+00:00"))
        assert ex["created_at"] == [int(stamp.timestamp())]
        assert ex["code"] == [row["code"].encode()]
        assert ex["big"] == [row["big"].encode()]


def test_what_schema_cannot_do_has_its_exit_status(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    nope = run_tfrecordd("schema", "--config", str(cfg), "--encoder", "nope")
    assert (nope.returncode, nope.stdout) == (EXIT_USAGE, "")
    assert nope.stderr == f"tfrecordd: {cfg}: no [encoders.nope] table (encoders: movies)\n"

    missing = run_tfrecordd("schema", "--infer", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 66, missing.stderr
    assert "none.jsonl: no such file" in missing.stderr

    neither = run_tfrecordd("schema")
    assert neither.returncode == EXIT_USAGE
    assert "give --config FILE" in neither.stderr
    assert "--infer FILE..." in neither.stderr

    both = run_tfrecordd("schema", "--config", str(cfg), "--infer", str(cfg))
    assert both.returncode == EXIT_USAGE

    wrong = run_tfrecordd("schema", "--infer", str(cfg), "--format", "python")
    assert wrong.returncode == EXIT_USAGE
    assert "jsonl or csv" in wrong.stderr

    unknown = run_tfrecordd("schema", "--infer", str(cfg))
    assert unknown.returncode == EXIT_USAGE
    assert "give --format jsonl or --format csv" in unknown.stderr
    delimiter = run_tfrecordd(
        "schema", "--infer", str(cfg), "--format", "csv", "--csv-delimiter", ";;"
    )
    assert delimiter.returncode == EXIT_USAGE
    assert "--csv-delimiter must be one character" in delimiter.stderr

    nothing = tmp_path / "flags.jsonl"
    nothing.write_text('{"ok": true}\nnot json\n')
    refused = run_tfrecordd("schema", "--infer", str(nothing))
    assert (refused.returncode, refused.stdout) == (EXIT_DATA, "")
    assert "1 line did not fit" in refused.stderr
    assert "ok: holds true/false" in refused.stderr


def test_the_docs_example_is_what_the_command_prints(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "docs" / "schema-inference.md").read_text()
    blocks = re.findall(r"```\w*\n(.*?)```", text, re.S)
    given = next(b for b in blocks if b.startswith('{"id": 1'))
    shown = next(b for b in blocks if b.startswith("# tfrecordd schema --infer"))
    (tmp_path / "clicks.jsonl").write_text(given)
    printed = run_tfrecordd("schema", "--infer", "clicks.jsonl", cwd=tmp_path)
    assert printed.returncode == EXIT_OK, printed.stderr
    assert printed.stdout == shown


def test_keys_holding_dollars_give_paths_that_read_them(tmp_path: Path) -> None:
    # Config string values are substituted (`$$` is a `$`, `${X}` a variable): a path naming
    # AngularJS's `$$hashKey`, or a key holding `${...}`, must come out escaped to read it.
    sample = tmp_path / "hk.jsonl"
    lines = [
        {"item": {"$$hashKey": f"object:{i}", "${TFRECORDD_UNSET_X}": i}, "$n": i} for i in range(2)
    ]
    sample.write_text("".join(json.dumps(line) + "\n" for line in lines))
    printed = run_tfrecordd("schema", "--infer", str(sample), "--name", "inferred")
    assert printed.returncode == EXIT_OK, printed.stderr
    cfg = write_datasets_config(
        tmp_path,
        {"hk": {"encoder": "inferred", "dir": tmp_path / "out"}},
        encoders={},
        sources=[{"name": "spool", "dataset": "hk"}],
    )
    cfg.write_text(cfg.read_text() + "\n" + printed.stdout)
    checked = run_tfrecordd("check-config", str(cfg))
    assert checked.returncode == EXIT_OK, checked.stderr
    done = run_tfrecordd("convert", "--config", str(cfg), str(sample), timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    examples = sorted(read_examples(tmp_path / "out"), key=lambda ex: ex["$n"])
    assert [ex["item.$$hashKey"] for ex in examples] == [[b"object:0"], [b"object:1"]]
    assert [ex["item.${TFRECORDD_UNSET_X}"] for ex in examples] == [[0], [1]]
