"""The dead-letter file: one JSON line per bad event, rotated at its cap."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tfrecordd.deadletter import NAME, DeadLetters
from tfrecordd.fsys import LOCAL


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_entries_keep_raw_bytes_reason_source_and_position(tmp_path: Path) -> None:
    dl = DeadLetters(str(tmp_path), LOCAL, 1 << 20)
    dl.write("spool", "a.jsonl:12", "malformed", "not JSON", b"{oops")
    dl.write("udp", "127.0.0.1:5000", "schema", "feature 'x': bad", b"\xff\x00")
    dl.close()
    first, second = lines(tmp_path / NAME)
    assert first["raw"] == "{oops"
    assert (first["source"], first["where"], first["reason"]) == (
        "spool",
        "a.jsonl:12",
        "malformed",
    )
    assert base64.b64decode(str(second["raw_base64"])) == b"\xff\x00"
    assert "raw" not in second


def test_rotation_at_the_cap_counts_what_it_discards(tmp_path: Path) -> None:
    dl = DeadLetters(str(tmp_path), LOCAL, 2048)
    discarded = sum(dl.write("s", f"w{i}", "r", "d", b"x" * 100) for i in range(100))
    dl.close()
    current = lines(tmp_path / NAME)
    previous = lines(tmp_path / (NAME + ".1"))
    assert (tmp_path / NAME).stat().st_size <= 2048
    assert len(current) + len(previous) + discarded == 100
    assert discarded > 0
    # Nothing is lost silently: the newest entries are kept, in order.
    kept = [e["where"] for e in previous + current]
    assert kept == [f"w{i}" for i in range(100 - len(kept), 100)]
