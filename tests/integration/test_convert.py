"""``tfrecordd convert`` through the real command line: JSON lines, CSV and a folder of images
into shards that TensorFlow reads back value for value; the same shards byte for byte from two
runs; the shard count and size options; the dead-letter exit status; a different conversion
refused over an existing one."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import (
    count_records,
    published_shards,
    read_shard_bytes,
    record_id,
    run_tfrecordd,
    write_datasets_config,
)
from tfrecordd.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE

FEATURES = {"id": "int64", "title": "bytes", "score": "float", "tags": {"type": "bytes"}}


SMALL = ("--shard-size", "64KiB")


def _config(root: Path, **dataset: Any) -> Path:
    return write_datasets_config(
        root,
        {"movies": {"encoder": "movies", "dir": root / "out"} | dataset},
        encoders={"movies": FEATURES},
        sources=[{"name": "spool", "dataset": "movies"}],
    )


def _event(i: int) -> dict[str, Any]:
    return {"id": i, "title": f"movie {i}", "score": i / 8, "tags": [f"t{i % 3}", "x"]}


def _jsonl(path: Path, ids: range) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(_event(i)) + "\n" for i in ids))
    return path


def _convert(cfg: Path, *args: str) -> Any:
    done = run_tfrecordd("convert", "--config", str(cfg), *args, timeout=120)
    return done


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(out.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


def _read_with_tf(tf: Any, out: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every record of the shards in ``out``, parsed by TensorFlow with ``spec``."""
    files = sorted(str(p) for p in published_shards(out))
    assert files, f"no shards in {out}"
    kind = {"gz": "GZIP", "zz": "ZLIB"}.get(files[0].rpartition(".")[2], "")
    rows = []
    for raw in tf.data.TFRecordDataset(files, compression_type=kind):
        row = {}
        for name, value in tf.io.parse_single_example(raw, spec).items():
            if isinstance(value, tf.sparse.SparseTensor):
                value = tf.sparse.to_dense(value)
            row[name] = np.asarray(value.numpy()).reshape(-1).tolist()
        rows.append(row)
    return rows


def _movie_spec(tf: Any) -> dict[str, Any]:
    return {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "title": tf.io.FixedLenFeature([], tf.string),
        "score": tf.io.FixedLenFeature([], tf.float32),
        "tags": tf.io.VarLenFeature(tf.string),
    }


@pytest.mark.tensorflow
def test_json_lines_read_back_by_tensorflow_value_for_value(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    cfg = _config(tmp_path)
    _jsonl(tmp_path / "in" / "b.jsonl", range(1000, 1500))
    _jsonl(tmp_path / "in" / "a.jsonl", range(0, 1000))
    done = _convert(cfg, str(tmp_path / "in"), "--workers", "2")
    assert done.returncode == EXIT_OK, done.stderr
    assert "1500 records from 2 files" in done.stderr
    assert "0 dead letters" in done.stderr
    rows = _read_with_tf(tf, tmp_path / "out", _movie_spec(tf))
    # Inputs in name order (a.jsonl before b.jsonl), records in input order.
    assert [r["id"][0] for r in rows] == list(range(1500))
    for r in rows[::97]:
        want = _event(r["id"][0])
        assert r["title"] == [want["title"].encode()]
        assert r["score"] == [pytest.approx(want["score"])]
        assert r["tags"] == [t.encode() for t in want["tags"]]
    # The manifests are the daemon's: verify checks each shard against its own.
    verify = run_tfrecordd("verify", *map(str, published_shards(tmp_path / "out")))
    assert verify.returncode == EXIT_OK, verify.stdout + verify.stderr


@pytest.mark.tensorflow
def test_csv_read_back_by_tensorflow(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    cfg = _config(tmp_path, compression="zlib")
    rows = ["id,title,score,tags"] + [f'{i},"movie, {i}",{i / 4},t{i}' for i in range(300)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "movies.csv").write_text("\r\n".join(rows) + "\r\n")
    done = _convert(cfg, str(tmp_path / "in" / "movies.csv"), "--workers", "1")
    assert done.returncode == EXIT_OK, done.stderr
    got = _read_with_tf(tf, tmp_path / "out", _movie_spec(tf))
    assert [r["id"][0] for r in got] == list(range(300))
    assert got[7]["title"] == [b"movie, 7"]
    assert got[7]["score"] == [pytest.approx(7 / 4)]
    assert got[7]["tags"] == [b"t7"]


@pytest.mark.tensorflow
def test_image_folder_read_back_by_tensorflow(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    from PIL import Image

    cfg = write_datasets_config(
        tmp_path,
        {"images": {"encoder": "images", "dir": tmp_path / "out", "compression": "none"}},
        encoders={},
        sources=[{"name": "spool", "dataset": "images", "format": "whole-file"}],
    )
    with cfg.open("a") as f:
        f.write('[encoders.images]\ntype = "image"\nlabels = { cat = 0, dog = 1 }\n')
    sizes = {}
    for label in ("cat", "dog"):
        (tmp_path / "pics" / label).mkdir(parents=True)
        for i in range(3):
            w, h = 5 + i, 3 + i
            buf = io.BytesIO()
            Image.new("RGB", (w, h), (i * 40, 10, 200)).save(buf, "PNG")
            name = f"{label}{i}.png"
            (tmp_path / "pics" / label / name).write_bytes(buf.getvalue())
            sizes[name] = (h, w, label)
    done = _convert(cfg, str(tmp_path / "pics"))
    assert done.returncode == EXIT_OK, done.stderr
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/class/text": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }
    files = [str(p) for p in published_shards(tmp_path / "out")]
    seen = []
    for raw in tf.data.TFRecordDataset(files):
        ex = tf.io.parse_single_example(raw, spec)
        name = ex["image/filename"].numpy().decode()
        h, w, label = sizes[name]
        image = tf.io.decode_png(ex["image/encoded"])
        assert tuple(image.shape) == (h, w, 3)
        assert ex["image/class/text"].numpy().decode() == label
        assert ex["image/class/label"].numpy() == ["cat", "dog"].index(label)
        seen.append(name)
    assert seen == sorted(sizes, key=lambda n: (sizes[n][2], n))


def test_same_inputs_give_the_same_shards_byte_for_byte(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    _jsonl(tmp_path / "in" / "a.jsonl", range(40_000))
    _jsonl(tmp_path / "in" / "sub" / "b.jsonl", range(40_000, 50_000))
    outs = []
    for n, workers in enumerate(("1", "2")):
        out = tmp_path / f"out{n}"
        done = _convert(cfg, str(tmp_path / "in"), "--out", str(out), "--workers", workers, *SMALL)
        assert done.returncode == EXIT_OK, done.stderr
        outs.append(_shard_bytes(out))
    assert len([n for n in outs[0] if n.endswith(".gz")]) > 3
    assert outs[0] == outs[1]
    # A run over what is done already writes nothing and says so.
    again = _convert(cfg, str(tmp_path / "in"), "--out", str(tmp_path / "out0"), *SMALL)
    assert again.returncode == EXIT_OK, again.stderr
    assert "(resumed)" in again.stderr
    assert _shard_bytes(tmp_path / "out0") == outs[0]


def test_shards_option_gives_exactly_n_named_of_n(tmp_path: Path) -> None:
    cfg = _config(tmp_path, compression="zstd")
    _jsonl(tmp_path / "in.jsonl", range(20_000))
    done = _convert(cfg, str(tmp_path / "in.jsonl"), "--shards", "4", "--workers", "2")
    assert done.returncode == EXIT_OK, done.stderr
    names = [p.name for p in published_shards(tmp_path / "out")]
    assert names == [f"part-0000{i}-of-00004.tfrecord.zst" for i in range(4)]
    count = count_records(tmp_path / "out")
    assert count.problems == []
    assert sorted(count.ids) == list(range(20_000))
    assert set(count.ids.values()) == {1}


def test_size_cap_cuts_shards(tmp_path: Path) -> None:
    cfg = _config(tmp_path, compression="none")
    _jsonl(tmp_path / "in.jsonl", range(20_000))
    done = _convert(cfg, str(tmp_path / "in.jsonl"), "--shard-size", "200KiB")
    assert done.returncode == EXIT_OK, done.stderr
    shards = published_shards(tmp_path / "out")
    assert len(shards) > 3
    # Batches are an eighth of the cap: every shard ends under it, and near it.
    sizes = [p.stat().st_size for p in shards]
    assert all(s <= 200 << 10 for s in sizes), sizes
    assert all(s > 150 << 10 for s in sizes[:-1]), sizes
    assert sorted(count_records(tmp_path / "out").ids) == list(range(20_000))


def test_a_shard_size_below_the_configs_least_is_a_usage_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(100))
    for size in ("0", "1", "4095"):
        done = _convert(cfg, str(src), "--shard-size", size)
        assert done.returncode == EXIT_USAGE, done.stderr
        assert done.stderr == (
            f"tfrecordd: --shard-size {size}: at least 4096 bytes (as max_shard_bytes)\n"
        )
    assert not (tmp_path / "out").exists()
    done = _convert(cfg, str(src), "--shard-size", "4KiB")
    assert done.returncode == EXIT_OK, done.stderr
    assert sorted(count_records(tmp_path / "out").ids) == list(range(100))


def test_dead_letters_exit_65_unless_allowed(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(10))
    with src.open("a") as f:
        f.write("not json\n")
        f.write(json.dumps({"id": "eleven"}) + "\n")
    done = _convert(cfg, str(src))
    assert done.returncode == EXIT_DATA == 65, done.stderr
    assert "2 dead letters" in done.stderr
    assert "--allow-dead-letters" in done.stderr
    letters = [
        json.loads(line)
        for line in (tmp_path / "out" / ".tfrecordd-convert" / "dead-letters.jsonl")
        .read_text()
        .splitlines()
    ]
    assert [d["reason"] for d in letters] == ["malformed", "schema"]
    assert letters[0]["raw"] == "not json"
    assert letters[0]["where"].startswith(f"{src}:")
    assert sorted(count_records(tmp_path / "out").ids) == list(range(10))
    allowed = _convert(cfg, str(src), "--out", str(tmp_path / "other"), "--allow-dead-letters")
    assert allowed.returncode == EXIT_OK, allowed.stderr
    assert "2 dead letters" in allowed.stderr


def test_other_arguments_over_an_existing_conversion_are_refused(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(100))
    assert _convert(cfg, str(src)).returncode == EXIT_OK
    before = _shard_bytes(tmp_path / "out")
    done = _convert(cfg, str(src), "--compression", "zstd")
    assert done.returncode == 73, done.stderr
    assert "other arguments" in done.stderr
    assert "compression: 'gzip' → 'zstd'" in done.stderr
    size = src.stat().st_size
    _jsonl(src, range(101))  # the input changed
    changed = _convert(cfg, str(src))
    assert changed.returncode == 73, changed.stderr
    # The refusal names the file and what changed in it.
    assert f"inputs changed: {src}: {size} bytes → {src.stat().st_size}" in changed.stderr
    _jsonl(src, range(100))
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    touched = _convert(cfg, str(src))
    assert touched.returncode == 73, touched.stderr
    assert f"{src}: modified (same size, a later modification time)" in touched.stderr
    extra = _jsonl(tmp_path / "more.jsonl", range(5))
    added = _convert(cfg, str(src), str(extra))
    assert added.returncode == 73, added.stderr
    assert f"{extra}: new" in added.stderr
    assert _shard_bytes(tmp_path / "out") == before


def test_a_level_out_of_range_is_a_usage_error_before_any_state(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(100))
    for compression, level in (("gzip", "99"), ("zstd", "99")):
        done = _convert(cfg, str(src), "--compression", compression, "--level", level)
        assert done.returncode == EXIT_USAGE, done.stderr
        assert done.stderr.startswith(f"tfrecordd: --level {level}: "), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert not (tmp_path / "out" / ".tfrecordd-convert" / "state.json").exists()
    good = _convert(cfg, str(src), "--compression", "gzip", "--level", "9")
    assert good.returncode == EXIT_OK, good.stderr
    assert sorted(count_records(tmp_path / "out").ids) == list(range(100))


def test_missing_input_is_exit_66(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    done = _convert(cfg, str(tmp_path / "nope.jsonl"))
    assert done.returncode == 66, done.stderr
    assert "nope.jsonl" in done.stderr


def test_progress_lines_off_a_terminal_and_a_bar_on_one(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(60_000))
    done = _convert(cfg, str(src), "--progress-interval", "0", "--workers", "1", *SMALL)
    assert done.returncode == EXIT_OK, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("convert: ") and "ETA" in x]
    assert lines, done.stderr
    assert "records/s" in lines[-1]
    assert "\x1b" not in done.stderr

    # On a terminal: one line redrawn in place, erased before the summary.
    master, slave = pty.openpty()
    argv = [sys.executable, "-m", "tfrecordd", "convert", "--config", str(cfg), str(src)]
    argv += ["--out", str(tmp_path / "tty"), "--workers", "1", *SMALL]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == EXIT_OK, seen
    text = seen.decode(errors="replace")
    assert "\r\x1b[Kconvert [" in text
    assert "ETA" in text
    assert "convert: 60000 records" in text


def test_a_second_conversion_into_the_same_output_exits_75(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(10))
    folder = tmp_path / "out" / ".tfrecordd-convert"
    folder.mkdir(parents=True)
    with (folder / "lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = _convert(cfg, str(src))
    assert done.returncode == 75, done.stderr
    assert "another tfrecordd convert" in done.stderr


def test_out_as_a_file_url(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    src = _jsonl(tmp_path / "in.jsonl", range(500))
    done = _convert(cfg, str(src), "--out", (tmp_path / "url").as_uri())
    assert done.returncode == EXIT_OK, done.stderr
    assert sorted(count_records(tmp_path / "url").ids) == list(range(500))


def test_output_inside_the_input_folder_is_not_read_back(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    _jsonl(tmp_path / "data" / "a.jsonl", range(300))
    (tmp_path / "data" / "old.jsonl.gz").write_bytes(b"\x1f\x8b not read")
    out = tmp_path / "data" / "shards"
    for _ in range(2):  # the second run finds the first one's shards inside its input
        done = _convert(cfg, str(tmp_path / "data"), "--out", str(out))
        assert done.returncode == EXIT_DATA, done.stderr
        assert "1 dead letter " in done.stderr
    assert "(resumed)" in done.stderr
    assert sorted(count_records(out).ids) == list(range(300))
    letter = json.loads((out / ".tfrecordd-convert" / "dead-letters.jsonl").read_text())
    assert letter["reason"] == "rejected"
    assert "compressed" in letter["detail"]


def test_output_named_by_a_symlink_into_the_input_folder_is_not_read_back(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    _jsonl(tmp_path / "data" / "a.jsonl", range(300))
    (tmp_path / "data" / "shards").mkdir()
    link = tmp_path / "linkout"
    link.symlink_to(tmp_path / "data" / "shards")
    for _ in range(2):  # the second run resumes: the first one's shards are not new inputs
        done = _convert(cfg, str(tmp_path / "data"), "--out", str(link))
        assert done.returncode == EXIT_OK, done.stderr
    assert "(resumed)" in done.stderr
    assert sorted(count_records(link).ids) == list(range(300))


def test_out_to_an_object_store_url_resumes_from_local_state(tmp_path: Path) -> None:
    """fsspec's in-memory store, so in this process: the daemon's object-store output uploads
    each shard; the state stays on this machine, under the dataset's staging root."""
    fsspec = pytest.importorskip("fsspec")
    from tfrecordd.config import load_config
    from tfrecordd.convert import Run, plan_conversion

    config = load_config(_config(tmp_path))
    src = _jsonl(tmp_path / "in.jsonl", range(3000))
    url = f"memory://bucket/{tmp_path.name}"

    def run() -> Any:
        plan = plan_conversion(config, "movies", [str(src)], out=url, shards=3, workers=2)
        assert plan.state_folder.startswith(str(tmp_path / "state"))
        return Run(plan, None).run()

    first = run()
    assert (first.records, first.shards, first.resumed) == (3000, 3, False)
    store = fsspec.filesystem("memory")
    names = sorted(p.rpartition("/")[2] for p in store.find(f"/bucket/{tmp_path.name}"))
    assert names == sorted(
        f"part-0000{i}-of-00003.{kind}"
        for i in range(3)
        for kind in ("manifest.json", "tfrecord.gz")
    )
    ids: list[int | None] = []
    for i in range(3):
        data = store.cat(f"/bucket/{tmp_path.name}/part-0000{i}-of-00003.tfrecord.gz")
        ids += [record_id(r) for r in read_shard_bytes(data, "x.tfrecord.gz")]
    assert ids == list(range(3000))
    again = run()
    assert (again.records, again.shards, again.resumed) == (3000, 3, True)
