"""Power loss: whatever an fsync did not make durable is forgotten, and acked events survive.

The daemon runs in-process with a :class:`~tfrecordd.fsys.FileSystem` that keeps a model of what
is durable: per file (by inode), its content as of its last fsync; per directory, its entries
(create, link, rename, unlink) as of its last directory fsync; a new file's entry is durable only
once its directory is fsynced. At a cut, chosen as the n-th file operation of a run, the model
freezes and the daemon is cancelled; then the real files are put back to the durable state:
entries not durable are removed, durable ones that were removed are restored, and every file is
cut back to its durable content. The daemon restarts on what is left.

An event is acked once its spool file is gone (deleted after publish). After every cut, every
event acked before it must be in a published shard, and every malformed line of an acked file in
the dead letters; at the end, every event is written exactly once.

What the daemon does around the layer: the directory source claims and deletes spool files with
``os.rename``/``os.unlink`` (seen here by comparing directory listings, so no hook is needed) and
fsyncs its folders, held open, through the daemon's layer (``fsync_dir_fd``, from its context); the
journal reads its file and truncates a torn tail with built-in ``open`` and ``os.fsync`` (it opens,
creates and appends through the layer); the dead-letter file is rotated with ``os.replace``.
Directories themselves (``shards/``, ``state/``, the claim folder) exist before the first cut and
are treated as durable, except in the runs with two datasets: there the outputs' folders and
``state/`` are trees whose new folders (a partition's ``dt=``/``hour=``/``country=`` levels,
``state/datasets/<name>/``) are durable only once their parent is fsynced; a cut removes the
others with all they hold. A file the source moves between the spool and its claim folder is
moved by one ``rename``, which journaling file systems make durable on both sides at once: the
model does too (else a cut between the two folders' fsyncs would leave two copies of it).

The runs with two datasets route one spool (the crash harness's events: ``type``, ``ts``,
``country``) into clicks, in folders by event hour in Europe/Berlin and by country with
completion markers, and impressions, unpartitioned, in shards kept open across commits. Besides
the acked events, each record must be in its own dataset and folder after every cut, and every
marker present must list exactly the shards of its partition.

The runs with kills end a run first as a kill does (:func:`run_until_killed`: before a sync
drawn at random, every file operation of the daemon raises, cleanup included), and cut the power
early in the restart's run. A killed process leaves what it wrote or linked since its last fsync
readable and not durable; a restart that acts on it as if it were durable (redoes a journal
record, publishes into a folder it found) leaves effects a later cut keeps and causes it takes.
The plain cuts cannot see this: each is a kill and a power cut at the same operation.

Every run is made with and without manifests: a manifest is published (and its directory
fsynced) right after its shard, which would hide a missing directory fsync after the shard's own
publish.

The control runs switch the daemon's directory fsyncs off (``fsync_dir`` does nothing, while
the model still counts new entries as not durable) and must report loss: proof the check can
fail. One control drops every directory fsync; the other only those of the output directory,
which without manifests are the fsyncs after each shard's publish (with two datasets: of both
outputs and their partition folders).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import orjson
import pytest

from tests.reliability.harness import (
    DATASETS,
    Place,
    ShardIndex,
    audit_markers,
    count_ids,
    dataset_event,
    datasets_config,
    dead_letter_place,
    expected_place,
    late_ids,
    markers_present,
)
from tests.support import claimed_files, intent_shards, movie_event, write_config
from tfrecordd.config import load_config
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.shards import STAGING_DIR
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd_plugins.sources.directory import CLAIM_DIR
from tfrecordd_plugins.sources.spool_names import original

pytestmark = [pytest.mark.anyio]


def _files(directory: str) -> dict[str, int]:
    """Regular files of a directory: name → inode."""
    out: dict[str, int] = {}
    with os.scandir(directory) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[entry.name] = st.st_ino
    return out


class Killed(BaseException):
    """The daemon's process was killed: no file operation of it gets done any more (a
    ``BaseException``, as a signal's death is: no handler of the daemon's takes it for an
    error to recover from)."""


class DurabilityModel:
    """What would survive a power cut, for the files of a few directories.

    Content is kept per file version, not per inode number: an inode number freed by an unlink
    is soon reused by the next file created, while the unlinked file's entry (and so its
    content) may still be durable.
    """

    def __init__(
        self, dirs: list[Path], trees: Sequence[Path] = (), renames: Sequence[Path] = ()
    ) -> None:
        self.dirs = [str(d.resolve()) for d in dirs]
        self.trees = [str(t.resolve()) for t in trees]
        """Folders whose subfolders come and go (a dataset's partition folders): a new
        folder's entry is durable only once its parent is fsynced."""
        self.renames = [str(d.resolve()) for d in renames]
        """Folders between which files move by ``rename(2)`` (the spool and its claim folder):
        a rename is one operation, so fsyncing either folder makes both of its sides durable,
        as journaling file systems (ext4, XFS, btrfs) do. Without this, a cut between the two
        folders' fsyncs leaves a claimed file under both names, each a copy of its own."""
        self.lock = threading.RLock()
        self.entries: dict[str, dict[str, int]] = {}
        """Per directory: durable name → file version."""
        self.subdirs: dict[str, set[str]] = {}
        """Per directory of a tree: its durable subfolders."""
        self.content: dict[int, bytes] = {}
        """Per file version: its durable bytes."""
        self.version_of: dict[int, int] = {}
        """Live inode number → its current file version."""
        self._versions = 0
        self.frozen = False
        self.ops = 0
        self.cut_at: int | None = None
        self.on_freeze: Callable[[], None] | None = None
        self.syncs = 0
        self.kill_at: int | None = None
        """The sync (file or directory fsync) before which the process is killed: from then on
        every file operation raises :class:`Killed`, undone, and what the process wrote stays
        as it was, durable or not (the page cache outlives a process)."""
        self.dead = False
        self.baseline()

    def _version(self, ino: int, *, new: bool = False) -> int:
        if new or ino not in self.version_of:
            self._versions += 1
            self.version_of[ino] = self._versions
        return self.version_of[ino]

    def _listing(self, directory: str) -> dict[str, int]:
        return {name: self._version(ino) for name, ino in _files(directory).items()}

    def baseline(self) -> None:
        """Everything on disk now is durable (the state after a clean sync or a restore)."""
        with self.lock:
            self.entries, self.content, self.version_of = {}, {}, {}
            self.subdirs = {}
            self.frozen = False
            for d in self.dirs:
                os.makedirs(d, exist_ok=True)
            found = list(self.dirs)
            for tree in self.trees:
                os.makedirs(tree, exist_ok=True)
                for here, subdirs, _ in os.walk(tree):
                    self.subdirs[here] = set(subdirs)
                    found.append(here)
            for d in found:
                self.entries[d] = self._listing(d)
                for name, version in self.entries[d].items():
                    self.content[version] = Path(d, name).read_bytes()

    def _renamed(self, path: str, before: set[int], after: set[int]) -> None:
        """``path`` was fsynced: the other side of each rename into or out of it is durable."""
        for other in self.renames:
            if other == path:
                continue
            real = self._listing(other)
            durable = self.entries[other]
            for name, version in list(durable.items()):
                if version in after - before and real.get(name) != version:
                    del durable[name]
            for name, version in real.items():
                if version in before - after:
                    durable[name] = version

    def _in_tree(self, path: str) -> bool:
        return any(path == t or path.startswith(t + os.sep) for t in self.trees)

    def op(self) -> None:
        """Count a file operation; freeze the durable state when the armed cut is reached."""
        with self.lock:
            if self.dead:
                raise Killed
            self.ops += 1
            if not self.frozen and self.cut_at is not None and self.ops >= self.cut_at:
                self.freeze()

    def sync_op(self) -> None:
        """Count an fsync (:meth:`op`); the process dies before it when the armed kill is
        reached. Kills come before syncs: what a killed process leaves that looks durable and
        is not is what it wrote or linked since its last fsync."""
        with self.lock:
            self.op()
            self.syncs += 1
            if self.kill_at is not None and self.syncs >= self.kill_at:
                self.dead = True
                raise Killed

    def freeze(self) -> None:
        with self.lock:
            if self.frozen:
                return
            if self.on_freeze is not None:
                self.on_freeze()
            self.frozen = True

    def created(self, fd: int) -> None:
        with self.lock:
            self._version(os.fstat(fd).st_ino, new=True)

    @staticmethod
    def file_now(fd: int) -> bytes:
        """What ``fd`` holds now: all that an fsync begun after this promises (bytes another
        thread writes while it runs may or may not be durable: counted as not)."""
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            return f.read()

    def sync_file(self, fd: int, seen: bytes) -> None:
        """An fsync of ``fd`` returned; ``seen``: :meth:`file_now` before it began."""
        with self.lock:
            if self.frozen:
                return
            self.content[self._version(os.fstat(fd).st_ino)] = seen

    def created_and_synced(self, path: Path) -> None:
        """A file written and fsynced outside the daemon (a producer's spool file)."""
        with self.lock:
            version = self._version(path.stat().st_ino, new=True)
            if not self.frozen:
                self.content[version] = path.read_bytes()

    def dir_now(self, path: str) -> tuple[dict[str, int], set[str]] | None:
        """The entries and subfolders of ``path`` now (``None``: not a directory the model
        keeps): all that a directory fsync begun after this promises (an entry another thread
        makes while it runs is counted as not durable)."""
        path = os.path.realpath(path)
        with self.lock:
            if path not in self.entries and not self._in_tree(path):
                return None
            subdirs = _subdirs(path) if self._in_tree(path) else set()
            return self._listing(path), subdirs

    def sync_dir(self, path: str, seen: tuple[dict[str, int], set[str]] | None = None) -> None:
        """A directory fsync of ``path`` returned; ``seen``: :meth:`dir_now` before it began
        (``None``: no other thread made entries there meanwhile, as for a producer's)."""
        path = os.path.realpath(path)
        with self.lock:
            if self.frozen or (path not in self.entries and not self._in_tree(path)):
                return
            now = self.dir_now(path) if seen is None else seen
            assert now is not None
            listing, subdirs = now
            before = set(self.entries.get(path, {}).values())
            self.entries[path] = listing
            for version in listing.values():
                self.content.setdefault(version, b"")
            if path in self.renames:
                self._renamed(path, before, set(listing.values()))
            if self._in_tree(path):
                self.subdirs[path] = subdirs
                for name in subdirs:
                    self.entries.setdefault(os.path.join(path, name), {})

    def apply_cut(self) -> dict[str, int]:
        """Put the files back to their durable state; returns what changed."""
        changed = {"removed": 0, "restored": 0, "cut_back": 0}
        with self.lock:
            for d in self.dirs:
                self._restore(d, changed)
            for tree in self.trees:
                self._restore_tree(tree, changed)
            self.baseline()
        return changed

    def _restore_tree(self, d: str, changed: dict[str, int]) -> None:
        self._restore(d, changed)
        for name in sorted(_subdirs(d)):
            sub = os.path.join(d, name)
            if name in self.subdirs.get(d, set()):
                self._restore_tree(sub, changed)
            else:
                # Never durable in its parent: the folder and all it holds are gone.
                changed["removed"] += 1 + sum(len(files) for _, _, files in os.walk(sub))
                shutil.rmtree(sub)

    def _restore(self, d: str, changed: dict[str, int]) -> None:
        real = self._listing(d)
        durable = self.entries.get(d, {})
        for name, version in real.items():
            if durable.get(name) != version:
                os.unlink(os.path.join(d, name))
                changed["removed"] += 1
        for name, version in durable.items():
            data = self.content.get(version, b"")
            path = Path(d, name)
            if real.get(name) == version:
                if path.read_bytes() != data:
                    path.write_bytes(data)
                    changed["cut_back"] += 1
            else:
                path.write_bytes(data)
                changed["restored"] += 1


def _subdirs(directory: str) -> set[str]:
    with os.scandir(directory) as it:
        return {e.name for e in it if e.is_dir(follow_symlinks=False)}


class PowerLossFs(FileSystem):
    """The real file system, with every durable step reported to a :class:`DurabilityModel`."""

    def __init__(self, model: DurabilityModel) -> None:
        self.model = model
        self.open_files: set[BinaryIO] = set()
        """Files opened through the layer and not closed: :meth:`reap` closes them after a
        kill, as the kernel does a dead process's."""

    def create_exclusive(self, path: str) -> BinaryIO:
        self.model.op()
        f = super().create_exclusive(path)
        self.model.created(f.fileno())
        self.open_files.add(f)
        return f

    def open_append(self, path: str) -> tuple[BinaryIO, bool]:
        f, created = super().open_append(path)
        self.open_files.add(f)
        return f, created

    def open_existing(self, path: str) -> BinaryIO:
        f = super().open_existing(path)
        self.open_files.add(f)
        return f

    def reap(self) -> None:
        """Close the files a killed daemon left open."""
        for f in list(self.open_files):
            f.close()
        self.open_files.clear()

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        self.model.op()
        super().write(f, data)

    def fsync(self, f: BinaryIO) -> None:
        self.model.sync_op()
        seen = self.model.file_now(f.fileno())
        super().fsync(f)
        self.model.sync_file(f.fileno(), seen)

    def close(self, f: BinaryIO) -> None:
        self.open_files.discard(f)
        try:
            self.model.op()
        finally:  # a killed process's files are closed too: by the kernel
            super().close(f)

    def fsync_dir(self, path: str) -> None:
        self.model.sync_op()
        seen = self.model.dir_now(path)
        super().fsync_dir(path)
        self.model.sync_dir(path, seen)

    def fsync_dir_fd(self, fd: int) -> None:
        self.model.sync_op()
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen = self.model.dir_now(path)
        super().fsync_dir_fd(fd)
        self.model.sync_dir(path, seen)

    def truncate(self, f: BinaryIO, size: int) -> None:
        self.model.op()
        super().truncate(f, size)

    def publish(self, src: str, dst: str) -> None:
        self.model.op()
        super().publish(src, dst)

    def replace(self, src: str, dst: str) -> None:
        self.model.op()
        super().replace(src, dst)

    def remove(self, path: str) -> None:
        self.model.op()
        super().remove(path)


class NoDirSyncFs(PowerLossFs):
    """Control: the daemon's directory fsyncs do nothing; new entries stay not durable."""

    def fsync_dir(self, path: str) -> None:
        self.model.op()


class NoOutputDirSyncFs(PowerLossFs):
    """Control: the output directories' fsyncs do nothing, their partition folders' neither (the
    staging folders', the journal's and the spool's do)."""

    def __init__(self, model: DurabilityModel, outputs: Sequence[Path]) -> None:
        super().__init__(model)
        self.outputs = [os.path.realpath(o) for o in outputs]

    def fsync_dir(self, path: str) -> None:
        real = os.path.realpath(path)
        for out in self.outputs:
            inner = real[len(out) :].split(os.sep)
            if real == out or (real.startswith(out + os.sep) and STAGING_DIR not in inner):
                self.model.op()
                return
        super().fsync_dir(path)


@dataclass
class Spool:
    """Spool files written durably by a producer (file and directory fsynced)."""

    path: Path
    model: DurabilityModel
    per_file: int = 100
    event: Callable[[int], dict[str, Any]] = movie_event
    place: Callable[[dict[str, Any]], Place | None] | None = None
    """Where each event's record belongs (with datasets): ``None`` from it, an event routed
    nowhere (a dead letter); no function, every event is a record of the one output."""
    next_id: int = 0
    files: dict[str, set[int]] = field(default_factory=dict)
    """Each file → the ids of its records."""
    bad: dict[str, set[str]] = field(default_factory=dict)
    """Each file → where its dead letters come from."""
    places: dict[int, Place] = field(default_factory=dict)

    def write(self, n: int) -> None:
        for _ in range(n):
            name = f"p{len(self.files):05d}.jsonl"
            ids: set[int] = set()
            bad: set[str] = set()
            body = bytearray()
            for _ in range(self.per_file):
                i = self.next_id
                self.next_id += 1
                event = self.event(i)
                place = self.place(event) if self.place is not None else None
                if self.place is not None and place is None:
                    bad.add(f"{name}:{len(body)}")
                else:
                    ids.add(i)
                if place is not None:
                    self.places[i] = place
                body += orjson.dumps(event) + b"\n"
                if i % 37 == 36:
                    bad.add(f"{name}:{len(body)}")
                    body += b"{broken\n"
            tmp = self.path / f".{name}.tmp"
            with tmp.open("wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            self.model.created_and_synced(tmp)
            os.rename(tmp, self.path / name)
            self.model.sync_dir(str(self.path))
            self.files[name], self.bad[name] = ids, bad

    def present(self) -> set[str]:
        """Producer files still in the spool or claimed (not yet acked)."""
        names = {n for n in os.listdir(self.path) if n in self.files}
        names |= {original(c.name) for c in claimed_files(self.path)}
        return names


def _dead_letter_places(state: Path) -> set[str]:
    places: set[str] = set()
    for name in ("dead-letters.jsonl", "dead-letters.jsonl.1"):
        path = state / name
        if path.exists():
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError):
                    places.add(dead_letter_place(orjson.loads(line)["where"]))
    return places


@dataclass
class CutFigures:
    cuts: int = 0
    cut_while_busy: int = 0
    kills: int = 0
    """Kills before a cut (runs with kills): each at a sync of a run, the cut in the next."""
    killed_while_busy: int = 0
    acked_checked: int = 0
    lost_acked: int = 0
    dead_letters_lost: int = 0
    duplicated: int = 0
    removed: int = 0
    restored: int = 0
    cut_back: int = 0
    misplaced: int = 0
    """Records in another dataset or partition folder than their own (two datasets)."""
    late: int = 0
    """Records dead-lettered as late (two datasets): none was late when first read."""
    markers: int = 0
    marker_problems: int = 0
    """Markers present that list other shards than their partition holds, at any look."""
    losses: list[str] = field(default_factory=list)


async def run_until_drained(daemon: Daemon, producer: Spool, stall: float = 60.0) -> None:
    """Run until every producer file is acknowledged, then stop. Fails when no file is
    acknowledged for ``stall`` seconds: the backlog the cuts leave grows with their number (the
    long run's is hundreds of files, a commit per 20 events), so no fixed total would do."""
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        left = len(producer.present())
        progress_at = time.monotonic()
        while left:
            await anyio.sleep(0.05)
            now = len(producer.present())
            if now < left:
                left, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > stall:
                raise TimeoutError(f"no spool file acknowledged for {stall:.0f}s; {left} left")
        daemon.request_stop()


async def until_cut_or_idle(
    model: DurabilityModel,
    producer: Spool,
    quiet: float = 0.3,
    bound: float = 5.0,
    reached: Callable[[], bool] | None = None,
) -> None:
    """Until the armed cut is reached (or what ``reached`` says), or the run went idle first:
    every producer file acked and no file operation for ``quiet`` seconds (a cut drawn past the
    run's last operation waited out all of ``bound`` before, a third of a run's cuts)."""
    done = reached or (lambda: model.frozen)
    with anyio.move_on_after(bound):
        ops, since = model.ops, time.monotonic()
        while not done():
            await anyio.sleep(0.005)
            if model.ops != ops:
                ops, since = model.ops, time.monotonic()
            elif time.monotonic() - since > quiet and not producer.present():
                return


async def run_until_killed(make: Callable[[], Daemon], fs: PowerLossFs, producer: Spool) -> bool:
    """Make a daemon and run it until the armed kill (or idle, as :func:`until_cut_or_idle`),
    then end it as a kill does: its file operations raise :class:`Killed` from the kill on, so
    nothing it does after, cleanup included, reaches the files (the kill may come while it is
    made: it reads state then). Whether the kill came before idle."""
    model = fs.model
    daemon: Daemon | None = None
    try:
        daemon = make()
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            await until_cut_or_idle(model, producer, reached=lambda: model.dead)
            tg.cancel_scope.cancel()
    except BaseException:
        # After the kill, whatever the daemon's tasks raise (the kill itself, or a stage that
        # found the next one gone) is the dead process's: a real one raises nothing more.
        if not model.dead:
            raise
    # What the kernel does for a dead process: its descriptors closed, its locks released (a
    # kill cut the daemon's own cleanup short at its first file operation).
    fs.reap()
    for source in daemon.sources.values() if daemon is not None else ():
        await source.aclose()
    killed = model.dead
    model.kill_at, model.dead = None, False
    return killed


CUT_EVENT_STEP = 6.0
"""Seconds of event time between two events of the runs with datasets: a run's 300 events span
half an hour, so a clicks' hour closes (its marker published) every few runs."""


async def run_cuts(
    root: Path,
    *,
    cuts: int,
    seed: int,
    manifests: bool = True,
    control: str | None = None,
    first_boot_synced: bool = True,
    datasets: bool = False,
    kills: bool = False,
) -> CutFigures:
    """``control``: ``"no-dir-fsync"`` or ``"no-output-dir-fsync"`` (see the module's doc).
    ``datasets``: the spool routed into two datasets (the crash harness's, with markers), whose
    partition folders, and the state folder's, are modelled as they come: a new folder is
    durable only once its parent is fsynced. ``kills``: each cut comes in the run after a kill
    (:func:`run_until_killed`, before a sync drawn at random): what the killed process left
    that looks durable and is not must not count as durable to the restart, which the cut
    then tests."""
    rng = random.Random(seed)
    shards, state, spool = root / "shards", root / "state", root / "spool"
    claims = spool / CLAIM_DIR / "test"  # the node's claim folder
    outputs = [root / d for d in DATASETS] if datasets else [shards]
    for d in (state, claims, *(out / STAGING_DIR / "test" for out in outputs)):
        d.mkdir(parents=True, exist_ok=True)
    if datasets:
        cfg = load_config(
            datasets_config(
                root,
                "gzip",
                manifests=manifests,
                daemon={"max_batch_events": 10},
                source={"poll_interval": "20ms"},
                datasets={"clicks": {"max_shard_age": "100ms"}},
            )
        )
        model = DurabilityModel(
            [spool, spool / CLAIM_DIR, claims], trees=[*outputs, state], renames=[spool, claims]
        )
    else:
        cfg = load_config(
            write_config(
                root,
                output={
                    "max_shard_records": 20,
                    "max_shard_age": "100ms",
                    "compression": "gzip",
                    "manifests": manifests,
                },
                daemon={"max_batch_events": 10},
                source={"poll_interval": "20ms"},
            )
        )
        staging = shards / STAGING_DIR / "test"  # the node's in-progress shards
        dirs = [shards, shards / STAGING_DIR, staging, state, spool, spool / CLAIM_DIR, claims]
        model = DurabilityModel(dirs, renames=[spool, claims])
    fs: PowerLossFs
    if control == "no-dir-fsync":
        fs = NoDirSyncFs(model)
    elif control == "no-output-dir-fsync":
        fs = NoOutputDirSyncFs(model, outputs)
    else:
        assert control is None, control
        fs = PowerLossFs(model)
    producer = Spool(spool, model)
    if datasets:
        producer.event = lambda i: dataset_event(i, CUT_EVENT_STEP)
        producer.place = expected_place
    figs = CutFigures()

    def published() -> Counter[int]:
        if not datasets:
            ids, problems = count_ids(shards)
            assert problems == [], problems
            return ids
        index = ShardIndex({d: root / d for d in DATASETS})
        index.refresh()
        assert index.problems == [], index.problems[:10]
        placed = index.placement(producer.places)
        assert placed.unexpected == 0
        figs.misplaced += len(placed.misplaced)
        figs.losses += placed.misplaced[:5]
        clicks = root / "clicks"
        marked = markers_present(clicks)
        figs.markers = max(figs.markers, len(marked))
        wrong = audit_markers(clicks, marked)
        figs.marker_problems += len(wrong)
        figs.losses += wrong[:5]
        return placed.ids

    acked_at_cut: set[str] = set()

    def snapshot_acks() -> None:
        acked_at_cut.clear()
        acked_at_cut.update(set(producer.files) - producer.present())

    model.on_freeze = snapshot_acks
    if first_boot_synced:
        # Start from a first boot whose files reached the disk (the other test cuts the
        # first boot itself).
        producer.write(1)
        await run_until_drained(Daemon(cfg, fs=fs, handle_signals=False), producer)
        model.baseline()
    for _ in range(cuts):
        producer.write(3)
        if kills:
            model.syncs, model.kill_at = 0, rng.randint(1, KILL_SYNCS)
            killed = await run_until_killed(
                lambda: Daemon(cfg, fs=fs, handle_signals=False), fs, producer
            )
            figs.kills += 1
            figs.killed_while_busy += killed
            acked = set(producer.files) - producer.present()
            ids = published()
            for name in acked:
                if missing := producer.files[name] - ids.keys():
                    figs.lost_acked += len(missing)
                    figs.losses.append(f"{name}: {len(missing)} acked events unpublished at a kill")
            producer.write(1)
        model.ops = 0
        model.cut_at = rng.randint(1, KILL_CUT_OPS if kills else 400)
        daemon = Daemon(cfg, fs=fs, handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            await until_cut_or_idle(model, producer)
            figs.cut_while_busy += model.frozen
            model.freeze()  # at the armed operation, or now if the run went idle first
            tg.cancel_scope.cancel()
        model.cut_at = None
        changed = model.apply_cut()
        figs.cuts += 1
        for k, v in changed.items():
            setattr(figs, k, getattr(figs, k) + v)
        ids = published()
        figs.duplicated += sum(c - 1 for c in ids.values())
        letters = _dead_letter_places(state)
        for name in acked_at_cut:
            figs.acked_checked += 1
            missing = producer.files[name] - ids.keys()
            figs.lost_acked += len(missing)
            figs.dead_letters_lost += len(producer.bad[name] - letters)
            if missing:
                figs.losses.append(f"{name}: {len(missing)} acked events lost")
    # After the last cut, a daemon without cuts drains the spool.
    await run_until_drained(Daemon(cfg, fs=fs, handle_signals=False), producer)
    ids = published()
    if datasets:
        figs.late = len(late_ids(state))
    everything = set().union(*producer.files.values())
    figs.lost_acked += len(everything - ids.keys())
    figs.duplicated = max(figs.duplicated, sum(c - 1 for c in ids.values()))
    figs.dead_letters_lost += len(set().union(*producer.bad.values()) - _dead_letter_places(state))
    return figs


KILL_CUT_OPS = 120
"""After a kill, the cut is drawn among the restart's first this many file operations: its
recovery and first commits, where what the killed process left is acted on."""

KILL_SYNCS = 60
"""Kills are drawn among the first this many syncs of a run (a run of the tests' cycles makes
about that many: spool, staging, output, partition folder, journal)."""


def _summary(figs: CutFigures) -> str:
    kills = f"{figs.kills} kills ({figs.killed_while_busy} mid-run), then " if figs.kills else ""
    return (
        f"{kills}{figs.cuts} power cuts ({figs.cut_while_busy} mid-run), "
        f"{figs.acked_checked} acked files checked: {figs.lost_acked} acked events lost, "
        f"{figs.duplicated} duplicated, "
        f"{figs.dead_letters_lost} dead letters lost, {figs.misplaced} misplaced, {figs.late} "
        f"late, {figs.markers} markers ({figs.marker_problems} wrong); the cuts removed "
        f"{figs.removed} entries, restored {figs.restored}, cut back {figs.cut_back} files"
    )


def check(figs: CutFigures, cuts: int) -> None:
    print(_summary(figs))
    assert figs.cuts == cuts
    assert figs.acked_checked > 0
    assert figs.removed + figs.cut_back > 0, "the cuts undid something"
    assert (figs.lost_acked, figs.duplicated, figs.dead_letters_lost) == (0, 0, 0), (
        _summary(figs),
        figs.losses[:5],
    )
    assert (figs.misplaced, figs.late, figs.marker_problems) == (0, 0, 0), figs.losses[:5]


manifests_on_and_off = pytest.mark.parametrize(
    "manifests", [True, False], ids=["manifests", "no-manifests"]
)


@manifests_on_and_off
async def test_power_cuts_lose_nothing_acked(tmp_path: Path, manifests: bool) -> None:
    check(await run_cuts(tmp_path, cuts=20, seed=11, manifests=manifests), 20)


@manifests_on_and_off
async def test_power_cuts_with_two_datasets_and_time_partitions(
    tmp_path: Path, manifests: bool
) -> None:
    """A spool routed into two datasets, clicks in hour and country folders with markers,
    impressions in shards kept open across commits: acked events survive every cut in their own
    dataset and folder, and every marker present lists exactly its partition's shards."""
    figs = await run_cuts(tmp_path, cuts=20, seed=15, manifests=manifests, datasets=True)
    check(figs, 20)
    assert figs.markers > 0, _summary(figs)


@manifests_on_and_off
async def test_kills_then_power_cuts_lose_nothing_acked(tmp_path: Path, manifests: bool) -> None:
    """A kill before a sync drawn at random, then a power cut in the restart's run: events
    acked before the kill and by the restart survive, however little the killed process made
    durable."""
    figs = await run_cuts(tmp_path, cuts=30, seed=21, manifests=manifests, kills=True)
    check(figs, 30)
    assert figs.killed_while_busy > figs.kills // 2, _summary(figs)


async def test_kills_then_power_cuts_with_two_datasets(tmp_path: Path) -> None:
    """As :func:`test_kills_then_power_cuts_lose_nothing_acked`, with two datasets, clicks in
    partition folders made as their hours come (a kill may come between a folder's ``mkdir``
    and its parent's fsync)."""
    figs = await run_cuts(tmp_path, cuts=40, seed=25, datasets=True, kills=True)
    check(figs, 40)
    assert figs.killed_while_busy > figs.kills // 2, _summary(figs)


async def test_control_with_two_datasets_without_the_output_fsyncs_reports_loss(
    tmp_path: Path,
) -> None:
    """The folders of both datasets (partition folders included) never fsynced: the check sees
    acked events lost, so the model follows folders made while the daemon runs."""
    figs = await run_cuts(
        tmp_path, cuts=8, seed=16, manifests=False, control="no-output-dir-fsync", datasets=True
    )
    print("control: " + _summary(figs))
    assert figs.lost_acked > 0, "without the output's fsyncs, acked events must be lost"


@manifests_on_and_off
async def test_control_without_directory_fsync_reports_loss(
    tmp_path: Path, manifests: bool
) -> None:
    figs = await run_cuts(tmp_path, cuts=8, seed=12, manifests=manifests, control="no-dir-fsync")
    print("control: " + _summary(figs))
    assert figs.lost_acked > 0, "without directory fsyncs, acked events must be lost"


async def test_control_without_the_fsync_after_publish_reports_loss(tmp_path: Path) -> None:
    """Without manifests nothing else fsyncs the output directory after a shard's publish: a
    daemon that skipped that fsync must be seen losing acked events."""
    figs = await run_cuts(tmp_path, cuts=8, seed=12, manifests=False, control="no-output-dir-fsync")
    print("control: " + _summary(figs))
    assert figs.lost_acked > 0, "without the fsync after publish, acked events must be lost"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@manifests_on_and_off
async def test_power_cuts_long(tmp_path: Path, manifests: bool) -> None:
    check(await run_cuts(tmp_path, cuts=200, seed=13, manifests=manifests), 200)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_power_cuts_with_two_datasets_long(tmp_path: Path) -> None:
    figs = await run_cuts(tmp_path, cuts=200, seed=17, datasets=True)
    check(figs, 200)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_kills_then_power_cuts_long(tmp_path: Path) -> None:
    check(await run_cuts(tmp_path, cuts=200, seed=23, kills=True), 200)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_kills_then_power_cuts_with_two_datasets_long(tmp_path: Path) -> None:
    check(await run_cuts(tmp_path, cuts=200, seed=27, datasets=True, kills=True), 200)


@manifests_on_and_off
async def test_power_cuts_from_the_first_boot(tmp_path: Path, manifests: bool) -> None:
    """The journal and the dead-letter file are new: their directory entries must be made
    durable before anything they hold is acked."""
    check(
        await run_cuts(tmp_path, cuts=10, seed=14, manifests=manifests, first_boot_synced=False), 10
    )


@pytest.mark.parametrize("manifests", [False, True])
@pytest.mark.parametrize("nth", [1, 3])
async def test_a_kill_after_a_link_then_a_power_cut_after_the_redone_acks(
    tmp_path: Path, manifests: bool, nth: int
) -> None:
    """Crash then cut: ``tfrecordd run`` is killed right after a shard's link, before the
    output directory's fsync (so the link is not durable yet); the restart redoes the commit's
    acks (spool files deleted), and the power is cut as soon as the first of them is durable.
    Every event of a deleted spool file must survive in a published shard: recovery fsyncs the
    output before it redoes any ack, with manifests (whose rebuild fsyncs it anyway) and
    without."""
    from tests.support import DaemonProcess, spool_file
    from tfrecordd.state.reading import scan_journal

    shards, state, spool = tmp_path / "shards", tmp_path / "state", tmp_path / "spool"
    cfg_path = write_config(
        tmp_path,
        output={"max_shard_records": 40, "max_shard_age": "200ms", "manifests": manifests},
        daemon={"max_batch_events": 10},
    )
    files: dict[str, set[int]] = {}
    for f in range(12):
        in_file = set(range(f * 10, f * 10 + 10))
        spool_file(spool, f"f{f:03d}.jsonl", [movie_event(i) for i in sorted(in_file)])
        files[f"f{f:03d}.jsonl"] = in_file
    d = DaemonProcess(cfg_path, env={"TFRECORDD_CRASH_AT": f"after-publish:{nth}"})
    assert d.wait(60) == 137, d.output()
    scan = scan_journal(str(state / "journal"))
    done = {r["seq"] for r in scan.records if r["t"] == "done"}
    open_shards = [
        s
        for r in scan.records
        if r["t"] == "intent" and r["seq"] not in done
        for s in intent_shards(r)
    ]
    assert len(open_shards) == 1, scan.records
    linked = open_shards[0]
    assert (shards / linked).exists()

    model = _linked_not_durable(tmp_path, linked)
    spool_dirs = str(spool.resolve())

    class CutAfterSpoolSync(PowerLossFs):
        def fsync_dir_fd(self, fd: int) -> None:
            super().fsync_dir_fd(fd)
            if os.readlink(f"/proc/self/fd/{fd}").startswith(spool_dirs):
                self.model.freeze()  # the first redone ack is durable: cut now

    daemon = Daemon(load_config(cfg_path), fs=CutAfterSpoolSync(model), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(10):
            while not model.frozen:
                await anyio.sleep(0.005)
        acked = set(files) - producer_present(spool, files)
        tg.cancel_scope.cancel()
    assert acked, "the restart redid the acks of the killed commit"
    model.apply_cut()
    ids, problems = count_ids(shards)
    assert problems == []
    lost = {name: len(files[name] - ids.keys()) for name in acked if files[name] - ids.keys()}
    assert lost == {}, f"acked spool files whose events the cut took: {lost}"


def _linked_not_durable(root: Path, linked: str) -> DurabilityModel:
    """The durability model after a kill that came after a shard's link and the unlink of its
    in-progress name, before the output directory was fsynced: durably, the shard is still
    under its in-progress name in the node's staging folder."""
    from tfrecordd.format.writer import inprogress_name
    from tfrecordd.outputs.shards import staging_dir

    shards, spool = root / "shards", root / "spool"
    staging = Path(staging_dir(str(shards), "test"))
    dirs = [shards, staging, root / "state", spool, spool / CLAIM_DIR, spool / CLAIM_DIR / "test"]
    model = DurabilityModel(dirs)
    durable_staged = model.entries[str(staging.resolve())]
    durable_staged[inprogress_name(linked)] = model.entries[str(shards.resolve())].pop(linked)
    return model


def producer_present(spool: Path, files: dict[str, set[int]]) -> set[str]:
    """Spool files not yet acked (in the spool or claimed)."""
    names = {n for n in os.listdir(spool) if n in files}
    return names | {original(c.name) for c in claimed_files(spool)}
