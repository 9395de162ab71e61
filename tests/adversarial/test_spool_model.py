"""The directory source against a model: generated producers, generated settings, restarts.

A hypothesis state machine plays producers (files published under odd names, into folders,
gzip-compressed or not, with lines too long for ``max_line_bytes`` and lines of junk; files kept
open and appended to; files cut; names replaced before the daemon claimed them) interleaved
with the daemon's steps (read, commit, ack, crash). Whatever the order, once the producers are
done and the daemon has caught up: the source never raised, nothing is left claimed, and every
line a producer wrote (and did not take back itself, by cutting or replacing its file before it
was read) is accounted for exactly once: published as an event, or dead-lettered with its first
bytes, or kept whole in ``.tfrecordd-rejected/`` with a reason.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import BinaryIO

import anyio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.adversarial.spool_steps import SpoolSteps
from tests.support import CI_DERANDOMIZED, claimed_files, examples
from tfrecordd_plugins.sources.directory import REASONS, REJECT_DIR

_ID = re.compile(rb'"id": (\d+)')
_NAMES = st.text(alphabet="abé%- _", min_size=1, max_size=6)


def _found(data: bytes) -> list[int]:
    return [int(m) for m in _ID.findall(data)]


class SpoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="spool-model-"))
        self.spool = self.root / "spool"
        self.spool.mkdir()
        self.next_id = 0
        self.written: set[int] = set()
        self.taken_back: set[int] = set()
        """Ids the producers themselves removed (a cut file, a name replaced before its claim):
        they may be missing, never doubled."""
        self.writers: dict[str, tuple[BinaryIO, list[int]]] = {}
        self.line_of: dict[int, bytes] = {}
        """Each id's line as the producer wrote it: an event must hold all of it."""
        self.unwritten: dict[str, bytes] = {}
        """The end of a producer's last line, held back (written at its next append or close)."""
        self.model: SpoolSteps | None = None
        self.fmt = "jsonl"
        self.gz = False
        self.moved = False

    def teardown(self) -> None:
        for f, _ in self.writers.values():
            f.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @initialize(
        fmt=st.sampled_from(["jsonl", "jsonl", "whole-file"]),
        on_done=st.sampled_from(["delete", "move"]),
        recursive=st.booleans(),
        max_line=st.sampled_from([64, 512, 1 << 16]),
        gz=st.booleans(),
    )
    def start(self, fmt: str, on_done: str, recursive: bool, max_line: int, gz: bool) -> None:
        self.fmt, self.gz = fmt, gz
        self.moved = on_done == "move"
        self.recursive = recursive
        self.model = SpoolSteps(
            self.spool,
            format=fmt,
            on_done=on_done,
            recursive=recursive,
            max_line_bytes=max_line,
            pattern=self._pattern(),
            max_file_bytes=1 << 20,
        )
        anyio.run(self.model.start)
        # One producer holds its file open from the start: the appends that follow may land
        # between any two of the daemon's steps.
        self.publish("first", "", 5, [0], [], keep_open=True)

    def _lines(self, n: int, pads: list[int], junk: list[bytes]) -> tuple[bytes, list[int]]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        out = []
        for i, k in enumerate(ids):
            out.append(json.dumps({"id": k, "pad": "x" * pads[i % len(pads)]}).encode())
            self.line_of[k] = out[-1]
            if junk and i < len(junk):
                out.append(junk[i])
        self.written.update(ids)
        return b"".join(line + b"\n" for line in out), ids

    def _encode(self, data: bytes) -> bytes:
        return gzip.compress(data, mtime=0) if self.gz else data

    def _pattern(self) -> str:
        """Plain files: any name, so that a file may take the name a folder has or had
        (``sub``, then ``sub/…``: in ``done_dir`` too)."""
        return "*.jsonl.gz" if self.gz else "*"

    @rule(
        name=_NAMES | st.sampled_from(["sub", "deeper"]),
        folder=st.sampled_from(["", "", "sub", "sub/deeper"]),
        n=st.integers(0, 30),
        pads=st.lists(st.integers(0, 200), min_size=1, max_size=4),
        junk=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=3),
        keep_open=st.booleans() | st.just(True),
        bare=st.booleans(),
    )
    def publish(
        self,
        name: str,
        folder: str,
        n: int,
        pads: list[int],
        junk: list[bytes],
        keep_open: bool,
        bare: bool = False,
    ) -> None:
        folder = folder if self.recursive else ""
        data, ids = self._lines(n, pads, junk)
        suffix = ".jsonl.gz" if self.gz else "" if bare else ".jsonl"
        target = self.spool / folder / f"{name}{suffix}"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a file has the folder's name
            self.taken_back.update(ids)
            return
        if target.is_dir() or (self.moved and target == self.spool / "done"):
            self.taken_back.update(ids)
            return
        tmp = target.parent / f".{target.name}.tmp"
        f = tmp.open("wb")
        f.write(self._encode(data))
        f.flush()
        if target.exists():  # a producer replacing its own file before the daemon took it
            if str(target) in self.writers:
                self._close(str(target))
            self.taken_back.update(_found(self._plain(target.read_bytes())))
        os.rename(tmp, target)
        if keep_open:
            if str(target) in self.writers:
                self._close(str(target))
            self.writers[str(target)] = (f, ids)
        else:
            f.close()

    def _plain(self, data: bytes) -> bytes:
        try:
            return gzip.decompress(data) if self.gz else data
        except (OSError, EOFError):
            return data

    def _writer(self, data: st.DataObject) -> str | None:
        """One of the files a producer holds open, or ``None``: drawn here, not by a
        precondition, so that no step is spent drawing rules that cannot run."""
        return data.draw(st.sampled_from(sorted(self.writers))) if self.writers else None

    @rule(data=st.data(), n=st.integers(1, 20), pad=st.integers(0, 200))
    def append(self, data: st.DataObject, n: int, pad: int) -> None:
        """Whole lines, or (plain files) lines whose last one is cut: the rest of it is written
        by the producer's next append, or when it closes the file (a buffered logger)."""
        if (key := self._writer(data)) is None:
            return
        f, ids = self.writers[key]
        lines, new = self._lines(n, [pad], [])
        ids += new
        if self.gz:
            f.write(self._encode(lines))
        else:
            lines = self.unwritten.pop(key, b"") + lines
            cut = data.draw(st.integers(0, min(len(lines) - 1, 40)), label="held back")
            f.write(lines[: len(lines) - cut])
            self.unwritten[key] = lines[len(lines) - cut :]
        f.flush()

    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        if (key := self._writer(data)) is None:
            return
        self._close(key)

    def _close(self, key: str) -> None:
        f, _ = self.writers.pop(key)
        f.write(self.unwritten.pop(key, b""))
        f.close()

    @rule(data=st.data())
    def cut(self, data: st.DataObject) -> None:
        """The producer truncates the file it still has open: what it held is its own loss
        (unless the daemon read it first), and the file is not deleted unread afterwards."""
        if (key := self._writer(data)) is None:
            return
        f, ids = self.writers[key]
        f.truncate(0)
        f.seek(0)
        self.unwritten.pop(key, None)
        self.taken_back.update(ids)
        ids.clear()

    @rule()
    def pump(self) -> None:
        assert self.model is not None
        anyio.run(self.model.pump)

    @rule()
    def commit(self) -> None:
        assert self.model is not None
        self.model.commit()

    @rule()
    def ack(self) -> None:
        assert self.model is not None
        anyio.run(self.model.ack)

    @rule()
    def crash(self) -> None:
        assert self.model is not None
        anyio.run(self.model.crash)

    @invariant()
    def nothing_doubled(self) -> None:
        if self.model is not None:
            counts = self._published()
            assert max(counts.values(), default=1) == 1, "a line published twice"

    def _published(self) -> Counter[int]:
        assert self.model is not None
        out: Counter[int] = Counter()
        for batch in self.model.published:
            for e in batch.expand():
                ids = _found(e.payload)
                out.update(ids)
                if self.fmt != "jsonl" or len(ids) != 1:
                    continue
                line, payload = self.line_of[ids[0]], bytes(e.payload)
                if e.error is None:
                    assert payload == line, f"a piece of a line published: {payload[:60]!r}"
                else:
                    assert line.startswith(payload), f"a dead letter not of one line: {payload!r}"
        return out

    def _rejected(self) -> set[int]:
        folder = self.spool / REJECT_DIR
        if not folder.exists():
            return set()
        out: set[int] = set()
        for p in folder.iterdir():
            if p.name != REASONS:
                out.update(_found(self._plain(p.read_bytes())))
        return out

    def teardown_check(self) -> None:
        assert self.model is not None
        for key in list(self.writers):
            self._close(key)

        async def drain() -> None:
            assert self.model is not None
            for _ in range(30):
                await self.model.pump()
                self.model.commit()
                await self.model.ack()
                if not claimed_files(self.spool) and not self._waiting():
                    break
            assert self.model.source is not None
            await self.model.source.aclose()

        anyio.run(drain)
        assert not claimed_files(self.spool), "files left claimed"
        assert not self._waiting(), "published files never claimed"
        published, rejected = self._published(), self._rejected()
        assert max(published.values(), default=1) == 1, "a line published twice"
        lost = sorted(self.written - self.taken_back - set(published) - rejected)
        assert not lost, f"lines lost: {lost[:20]}"
        reasons = self.spool / REJECT_DIR / REASONS
        kept = [p for p in (self.spool / REJECT_DIR).iterdir() if p.name != REASONS]
        assert len(kept) <= (len(reasons.read_text().splitlines()) if reasons.exists() else 0)

    def _waiting(self) -> list[Path]:
        pattern = self._pattern()
        found = self.spool.rglob(pattern) if self.recursive else self.spool.glob(pattern)
        skip = {REJECT_DIR, ".tfrecordd-claimed", "done"}
        return [
            p
            for p in found
            if p.is_file()
            and not p.name.startswith(".")
            and not skip & set(p.relative_to(self.spool).parts)
        ]


class _Checked(SpoolMachine):
    def teardown(self) -> None:
        try:
            if self.model is not None:
                self.teardown_check()
        finally:
            super().teardown()


_Checked.TestCase.settings = settings(
    max_examples=examples(60, 600),
    derandomize=CI_DERANDOMIZED,
    stateful_step_count=25,
    deadline=None,
)
test_the_spool_against_its_model = _Checked.TestCase
