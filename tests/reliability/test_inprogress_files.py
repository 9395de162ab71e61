"""Where shards being written live, and whose they are.

Readers glob the output while the daemon writes: no glob for finished shards may find an
in-progress shard or its offsets file, with any globber a training job uses (TensorFlow's and
fsspec's do not skip hidden names). Several daemons may share one output directory: a restart
discards the in-progress files of its own node only, recognised by their exact name structure,
not by a substring of the node id.
"""

from __future__ import annotations

import glob
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support import (
    DaemonProcess,
    inprogress_files,
    metric_sum,
    movie_event,
    read_ids,
    shard_files,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.metrics import Metrics
from tfrecordd.outputs.shards import leftovers, staging_dir
from tfrecordd.pipeline.runtime import Daemon

SHARD_GLOBS = [
    "*.tfrecord*",
    "*.tfrecord.gz",
    "part-*.tfrecord*",
    "*.gz",
    "*/*.tfrecord*",
    "*/*/*.tfrecord*",
    "**/*.tfrecord*",
    "**/*.gz",
]
"""Patterns a reader uses for the finished shards of one output directory."""
NAME_GLOBS = ["part-*", "**/part-*"]
"""Patterns for every published file of the directory: shards and manifests."""
OPEN_EVENTS = 70_000
"""Events in the shard held open: past OFFSETS_IN_MEMORY, so its offsets wait in a file too."""


def _names(tail: str, node: str = "ingest-01", run: str = "71f18d") -> str:
    return f"part-20261122T021723.729024Z-{node}-{run}-000001{tail}"


# -- whose in-progress files are they -----------------------------------------------------------


def test_leftovers_are_told_apart_by_their_exact_structure(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    mine, theirs = Path(staging_dir(str(out), "ingest")), Path(staging_dir(str(out), "ingest-01"))
    mine.mkdir(parents=True)
    theirs.mkdir(parents=True)
    own_new = [
        mine / ".part-x_tfrecord_gz.inprogress",
        mine / ".part-x_tfrecord_gz_offsets.inprogress",
    ]
    own_old = [
        out / f".{_names(t, node='ingest')}.inprogress"
        for t in (
            ".tfrecord.gz",
            ".tfrecord.gz.offsets",
            ".tfrecord",
            ".tfrecord.zst",
            ".manifest.json",
        )
    ]
    others = [
        theirs / ".part-y_tfrecord_gz.inprogress",
        # Older versions' files of other nodes whose id holds "ingest" (or is held in it).
        out / f".{_names('.tfrecord.gz')}.inprogress",
        out / f".{_names('.tfrecord.gz', node='ingest-01-a')}.inprogress",
        out / f".{_names('.tfrecord.gz', node='x-ingest')}.inprogress",
        out / f".{_names('.tfrecord.gz', node='ingest', run='01abcd')}.inprogress.bak",
        out / f".{_names('.tfrecord.gz', node='ingest')}.in",
        out / ".ingest.inprogress",
        out / _names(".tfrecord.gz", node="ingest"),
        # What the operator keeps in the staging folder is not an in-progress file.
        mine / "notes.txt",
        mine / ".part-x.tfrecord.gz.inprogress.keep",
    ]
    for p in own_new + own_old + others:
        p.write_bytes(b"x")
    assert leftovers(str(mine), str(out), "ingest") == sorted(map(str, own_new + own_old))
    assert leftovers(str(theirs), str(out), "ingest-01") == sorted(map(str, [others[0], others[1]]))
    assert leftovers(str(tmp_path / "none"), str(tmp_path / "none"), "ingest") == []


async def _until(predicate: Any, timeout: float = 60.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


def _written(m: Metrics) -> float:
    return metric_sum(m.registry, "tfrecordd_records_written_total")


@pytest.mark.anyio
@pytest.mark.parametrize(("holder", "starter"), [("ingest-01", "ingest"), ("ingest", "ingest-01")])
async def test_a_starting_daemon_keeps_another_nodes_open_shard(
    tmp_path: Path, holder: str, starter: str
) -> None:
    """Two daemons share one output; one holds an open shard while the other (whose node id is
    a part of the first one's, or the reverse) starts and recovers. The open shard survives and
    is published: every event once."""
    out = tmp_path / "shards"
    configs = {
        node: load_config(
            write_config(
                tmp_path / node,
                daemon={"node_id": node},
                output={"dir": out, "max_shard_age": "1h"},
            )
        )
        for node in (holder, starter)
    }
    spool_file(tmp_path / holder / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    spool_file(tmp_path / starter / "spool", "b.jsonl", [movie_event(i) for i in range(100, 150)])
    first = Daemon(configs[holder], handle_signals=False)
    second = Daemon(configs[starter], handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(first.run)
        await _until(lambda: _written(first.metrics) >= 100)
        held = inprogress_files(out)
        assert held, "the first daemon holds an open shard"
        await tg.start(second.run)
        assert all(p.exists() for p in held), "the second daemon discarded the first's shard"
        await _until(lambda: _written(second.metrics) >= 50)
        second.request_stop()
        first.request_stop()
    assert read_ids(out) == dict.fromkeys(range(150), 1)
    assert not inprogress_files(out)


# -- what readers' globs see while a shard is open ---------------------------------------------


class LiveOutput:
    """A daemon process with one published shard and one open shard (and its offsets file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.out = root / "shards"
        cfg = write_config(root, daemon={"node_id": "ingest-01"}, output={"max_shard_age": "1h"})
        spool_file(root / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
        self.daemon = DaemonProcess(cfg)
        self.daemon.wait_started(120)
        wait_for(lambda: not list((root / "spool").glob("*.jsonl")), 120)
        self.daemon.signal(signal.SIGUSR1)
        wait_for(lambda: len(shard_files(self.out)) == 1, 120)
        events = (movie_event(i) for i in range(100, 100 + OPEN_EVENTS))
        spool_file(root / "spool", "b.jsonl", events)
        wait_for(lambda: any("offsets" in p.name for p in inprogress_files(self.out)), 300)
        self.open = inprogress_files(self.out)
        assert len(self.open) == 2, self.open
        assert all(p.stat().st_size for p in self.open), self.open

    def allowed(self, pattern: str) -> set[str]:
        """What the pattern may find: the published shards, and, for a pattern of every
        published name, their manifests."""
        names = {p for p in self.out.iterdir() if p.is_file() and not p.name.startswith(".")}
        if pattern not in NAME_GLOBS:
            names = set(shard_files(self.out))
        return {os.path.realpath(p) for p in names}

    def finish(self) -> None:
        assert self.open == inprogress_files(self.out), "the shard stayed open while globbing"
        assert self.daemon.stop(120) == 0, self.daemon.output()[-3000:]
        assert read_ids(self.out) == dict.fromkeys(range(100 + OPEN_EVENTS), 1)
        assert not inprogress_files(self.out)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveOutput]:
    live = LiveOutput(tmp_path_factory.mktemp("live"))
    try:
        yield live
        live.finish()
    finally:
        live.daemon.kill()


def _check(live: LiveOutput, globber: str, found: list[str], pattern: str, *, exact: bool) -> None:
    seen = {os.path.realpath(p) for p in found}
    allowed = live.allowed(pattern)
    assert seen <= allowed, f"{globber}({pattern!r}) sees unpublished files: {seen - allowed}"
    if exact:
        assert seen == allowed, f"{globber}({pattern!r}) misses published files"


@pytest.mark.parametrize("pattern", SHARD_GLOBS + NAME_GLOBS)
def test_python_and_fsspec_globs_see_no_open_shard(live: LiveOutput, pattern: str) -> None:
    import fsspec

    out = live.out
    full = str(out / pattern)
    # The shards sit at the top: a pattern of subfolders finds nothing, but must find no more.
    exact = "/" not in pattern or pattern.startswith("**/")
    _check(live, "glob", glob.glob(full, recursive=True), pattern, exact=exact)
    hidden = glob.glob(full, recursive=True, include_hidden=True)
    _check(live, "glob(include_hidden)", hidden, pattern, exact=exact)
    _check(live, "Path.glob", [str(p) for p in out.glob(pattern)], pattern, exact=exact)
    if pattern.startswith("**/"):
        rglob = [str(p) for p in out.rglob(pattern.removeprefix("**/"))]
        _check(live, "Path.rglob", rglob, pattern, exact=True)
    local = fsspec.filesystem("file")
    _check(live, "fsspec", local.glob(full), pattern, exact=exact)
    _check(live, "fsspec(file://)", local.glob(f"file://{full}"), pattern, exact=exact)


@pytest.mark.tensorflow
@pytest.mark.parametrize("pattern", SHARD_GLOBS + NAME_GLOBS)
def test_tensorflow_globs_see_no_open_shard(live: LiveOutput, pattern: str) -> None:
    tf = pytest.importorskip("tensorflow")
    full = str(live.out / pattern)
    # TensorFlow reads "**" as "*": one folder level, not the root's files.
    exact = "/" not in pattern
    _check(live, "tf.io.gfile.glob", tf.io.gfile.glob(full), pattern, exact=exact)
    matched = [p.decode() for p in tf.io.matching_files(full).numpy()]
    _check(live, "tf.io.matching_files", matched, pattern, exact=exact)
    try:
        listed = [
            p.decode() for p in tf.data.Dataset.list_files(full, shuffle=False).as_numpy_iterator()
        ]
    except tf.errors.InvalidArgumentError:
        # list_files refuses a pattern that matches nothing.
        listed = []
    _check(live, "tf.data.Dataset.list_files", listed, pattern, exact=exact)
