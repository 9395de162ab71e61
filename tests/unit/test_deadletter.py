"""The dead-letter file: one JSON line per bad event, rotated at its cap."""

from __future__ import annotations

import base64
import errno
import json
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from tfrecordd.errors import DurabilityError
from tfrecordd.fsys import LOCAL, FileSystem
from tfrecordd.state.deadletter import NAME, DeadLetters, cut_uncommitted
from tfrecordd.state.reading import read_checkpoint
from tfrecordd.state.records import Checkpoint, Intent


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


def test_writes_and_syncs_from_several_threads_keep_every_line_whole(tmp_path: Path) -> None:
    """The write stage writes dead letters while a commit syncs them, in other threads; with
    rotations in between, every letter is counted once: kept whole or counted as discarded."""
    dl = DeadLetters(str(tmp_path), LOCAL, 4096)
    discarded = [0, 0]
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(k: int) -> None:
        try:
            for i in range(3000):
                discarded[k] += dl.write("s", f"{k}:{i}", "r", "d", b"x" * (i % 90))
        except BaseException as e:
            errors.append(e)

    def syncer() -> None:
        try:
            while not done.is_set():
                dl.sync()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    sync = threading.Thread(target=syncer)
    for t in [*threads, sync]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sync.join()
    dl.close()
    assert errors == []
    kept = lines(tmp_path / (NAME + ".1")) + lines(tmp_path / NAME)
    assert len(kept) + sum(discarded) == 6000
    # Each writer's letters in its order; the last written is kept.
    for k in (0, 1):
        mine = [int(str(e["where"]).split(":")[1]) for e in kept if str(e["where"])[0] == str(k)]
        assert mine == sorted(mine)
    assert str(kept[-1]["where"]).endswith(":2999")


class _FullAfter(FileSystem):
    """Writes ``room`` more bytes, then fails with ENOSPC, as a full file system does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        view = memoryview(data)
        if len(view) > self.room:
            f.write(view[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(view)
        super().write(f, view)


@pytest.mark.parametrize("room", [0, 1, 150, 333])
def test_a_full_disk_never_leaves_a_torn_dead_letter(tmp_path: Path, room: int) -> None:
    dl = DeadLetters(str(tmp_path), _FullAfter(room), 1 << 20)
    written: list[int] = []

    def fill() -> None:
        for i in range(100):
            dl.write("spool", f"a.jsonl:{i}", "malformed", "not JSON", b"{" + b"x" * 100)
            written.append(i)

    with pytest.raises(DurabilityError, match="state_dir is full"):
        fill()
    with pytest.raises(DurabilityError):
        dl.write("spool", "a.jsonl:x", "malformed", "not JSON", b"{")
    dl.close()
    data = (tmp_path / NAME).read_bytes()
    assert data == b"" or data.endswith(b"\n")
    assert [x["where"] for x in lines(tmp_path / NAME)] == [f"a.jsonl:{i}" for i in written]


def test_a_line_cut_short_by_a_crash_is_cut_off_at_open(tmp_path: Path) -> None:
    dl = DeadLetters(str(tmp_path), LOCAL, 1 << 20)
    dl.write("spool", "a.jsonl:1", "malformed", "not JSON", b"{one")
    dl.close()
    with (tmp_path / NAME).open("ab") as f:
        f.write(b'{"time": 1, "source": "spool", "wh')
    dl = DeadLetters(str(tmp_path), LOCAL, 1 << 20)
    dl.write("spool", "a.jsonl:2", "malformed", "not JSON", b"{two")
    dl.close()
    assert [x["where"] for x in lines(tmp_path / NAME)] == ["a.jsonl:1", "a.jsonl:2"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_symlink_or_fifo_in_place_of_the_file_is_refused_not_followed(
    tmp_path: Path, kind: str
) -> None:
    import os

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    if kind == "symlink":
        (tmp_path / NAME).symlink_to(victim)
    else:
        os.mkfifo(tmp_path / NAME)
    dl = DeadLetters(str(tmp_path), LOCAL, 1 << 20)
    with pytest.raises(DurabilityError, match=str(tmp_path / NAME)):
        dl.write("spool", "a.jsonl:1", "malformed", "not JSON", b"{one")
    dl.close()
    assert victim.read_bytes() == b"precious\n"


def test_a_cut_back_to_a_commits_end_keeps_exactly_the_dead_letters_before_it(
    tmp_path: Path,
) -> None:
    """What a commit's intent records (``end()`` at its cut) and what recovery cuts back to:
    the dead letters written after it go, those before stay; another file at the path, or one
    that did not grow, is left alone."""
    dl = DeadLetters(str(tmp_path), LOCAL, 1 << 20)
    assert dl.end() == [], "no file yet"
    dl.write("spool", "a.jsonl:1", "malformed", "x", b"committed")
    dl.sync()
    end = dl.end()
    assert end is not None
    assert end[2] == (tmp_path / NAME).stat().st_size
    dl.write("spool", "b.jsonl:1", "malformed", "x", b"replays")
    dl.close()
    assert cut_uncommitted(LOCAL, str(tmp_path), end) > 0
    assert [x["raw"] for x in lines(tmp_path / NAME)] == ["committed"]
    assert cut_uncommitted(LOCAL, str(tmp_path), end) == 0, "nothing after it: nothing cut"
    assert cut_uncommitted(LOCAL, str(tmp_path), [end[0], end[1] + 1, 0]) == 0, "another file"
    assert [x["raw"] for x in lines(tmp_path / NAME)] == ["committed"]
    assert cut_uncommitted(LOCAL, str(tmp_path), []) > 0, "no file at the cut: all of it goes"
    assert (tmp_path / NAME).read_bytes() == b""
    assert cut_uncommitted(LOCAL, str(tmp_path / "none"), []) == 0


def test_the_end_a_commit_records_survives_the_journal_and_the_checkpoint(tmp_path: Path) -> None:
    intent = Intent(7, {"s": [1]}, dead_letters=[1, 2, 3])
    assert Intent.from_json(intent.to_json()).dead_letters == [1, 2, 3]
    assert Intent.from_json(Intent(8, {}, dead_letters=[]).to_json()).dead_letters == []
    assert Intent.from_json(Intent(9, {}).to_json()).dead_letters is None, "an earlier version"
    bad = intent.to_json() | {"dead_letters": ["x", 2, 3]}
    assert Intent.from_json(bad).dead_letters is None, "not understood: nothing is cut"
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(Checkpoint(10, last_commit=(9, [1, 2, 3])).to_json()))
    ckpt = read_checkpoint(str(path))
    assert ckpt is not None
    assert ckpt.last_commit == (9, [1, 2, 3])
