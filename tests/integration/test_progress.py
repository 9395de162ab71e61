"""Progress of verify and transcode: a bar on a terminal, one plain line per file otherwise."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrecordd.cli import main
from tfrecordd.errors import EXIT_DATA, EXIT_OK
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import open_writer
from tfrecordd.progress import Progress

ERASE = "\r\x1b[K"


def _shards(root: Path, n: int, records: int = 3000) -> list[Path]:
    paths = []
    for i in range(n):
        path = root / f"part-{i}.tfrecord.gz"
        with open_writer(path, Compression.GZIP) as w:
            w.write_many([b"record %d" % j for j in range(records)])
        paths.append(path)
    return paths


def test_plain_lines_one_per_file_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("verify", 2, stream=out, tty=False) as p:
        p.start("a")
        p.advance(10)
        p.done("a", "10 records")
        p.start("b")
        p.done("b", "BAD after 0 records")
    assert out.getvalue() == "verify: 1/2 a: 10 records\nverify: 2/2 b: BAD after 0 records\n"
    assert "\x1b" not in out.getvalue()


def test_bar_redraws_in_place_and_is_erased_at_the_end() -> None:
    out = io.StringIO()
    with Progress("transcode", 4, stream=out, tty=True) as p:
        p.start("first")
        p.advance(7)
        p.done("first", "7 records")
        p.clear()
        out.write("a line of output\n")
        p.start("second")
    text = out.getvalue()
    assert "\n" not in text.replace("a line of output\n", "")
    frames = [f for f in text.split(ERASE) if f]
    assert frames[0] == "transcode [" + "." * 24 + "] 0/4 files, 0 records  first"
    assert "transcode [" + "#" * 6 + "." * 18 + "] 1/4 files, 7 records" in frames
    assert text.endswith(ERASE), "the bar is erased when the work ends"
    before_line = text.index("a line of output")
    assert text[:before_line].endswith(ERASE), "clear() erases the bar before other output"


def test_verify_in_process_prints_plain_progress_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _shards(tmp_path, 2)
    bad = tmp_path / "missing.tfrecord"
    code = main(["verify", "--json", *map(str, good), str(bad)])
    out, err = capsys.readouterr()
    assert code != EXIT_OK
    assert err.splitlines() == [
        f"verify: 1/3 {good[0]}: 3000 records",
        f"verify: 2/3 {good[1]}: 3000 records",
        f"verify: 3/3 {bad}: BAD after 0 records",
    ]
    assert json.loads(out)["bad_files"] == 1
    # Without --json, the progress goes to stderr too, unless stderr is the very file stdout
    # is (2>&1, or one terminal): then verify's own line per file is the progress.
    code = main(["verify", *map(str, good)])
    out, err = capsys.readouterr()
    assert code == EXIT_OK
    assert f"OK   {good[0]}: 3000 records" in out
    assert err.splitlines() == [
        f"verify: 1/2 {good[0]}: 3000 records",
        f"verify: 2/2 {good[1]}: 3000 records",
    ]


def test_transcode_in_process_prints_plain_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _shards(tmp_path, 2)
    (tmp_path / "out").mkdir()
    code = main(["transcode", *map(str, src), "--to", "zstd", "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == EXIT_OK
    assert err.splitlines() == [
        f"transcode: 1/2 {src[0]}: 3000 records",
        f"transcode: 2/2 {src[1]}: 3000 records",
    ]


def _run_with_stderr_on_a_terminal(*argv: str) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfrecordd", *argv],
            stdout=subprocess.PIPE,
            stderr=slave,
            stdin=subprocess.DEVNULL,
        )
        os.close(slave)
        chunks: list[bytes] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            chunks.append(data)
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        proc.stdout.close()
        code = proc.wait(30)
    finally:
        os.close(master)
    return code, out, b"".join(chunks).decode()


def test_verify_draws_a_bar_when_stderr_is_a_terminal(tmp_path: Path) -> None:
    good = _shards(tmp_path, 3)
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(good[0].read_bytes()[:-20])
    code, out, err = _run_with_stderr_on_a_terminal("verify", *map(str, good), str(cut))
    assert code == EXIT_DATA
    assert "verify: " not in err, "no plain lines on a terminal"
    assert ERASE + "verify [" in err
    assert "] 0/4 files, 0 records" in err
    assert "] 3/4 files, 9000 records" in err
    assert err.endswith(ERASE), "the bar is erased before the command ends"
    assert out.splitlines()[-1].endswith(" records in 4 files, 1 bad")
    assert "BAD  " in out
