"""One conversion run: units encoded on every core, their batches written in order into shards
the daemon's way, each shard published, its manifest written, then the state saved.

Batches come back from the encode processes in the order of the units and go to the open shard
in that order. A shard ends when the next batch does not fit under the size cap (the daemon's
rule, :meth:`~tfrecordd.outputs.shards.OpenShard.fits`), or with ``--shards N`` when the next
unit belongs to the next of the N runs of units of about equal input bytes. So every shard
starts at a batch, and a resumed run, which starts a fresh shard at the batch after the last
state, writes the shards an uninterrupted run writes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfrecordd.convert import runstate
from tfrecordd.convert.encodeunits import Batch, EncodeSetup, encode_unit, init_process
from tfrecordd.convert.inputs import UNIT_BYTES, InputFile, Unit, fingerprint
from tfrecordd.convert.meter import Meter
from tfrecordd.format.compression import SUFFIXES
from tfrecordd.fsys import LOCAL, FileSystem
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import LocalOutput, Output
from tfrecordd.outputs.shards import FinishedShard, OpenShard, leftovers

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

NODE_ID = "convert"
"""The staging folder of a conversion's shards: ``<output>/.unpublished/convert/``."""
_NO_CAP = 1 << 62


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run writes and how (all but ``workers`` and ``meter`` is fixed by the arguments)."""

    directory: str
    """The output: a local directory, or a URL."""
    state_folder: str
    """Where the state, its lock and the dead letters are (local)."""
    store_config: DaemonConfig | None
    """For a URL output: the config its :class:`FsspecOutput` is made from (the dataset's
    ``dir`` the URL, the node id ``convert``); ``None`` for a local directory."""
    files: Sequence[InputFile]
    units: Sequence[Unit]
    setup: EncodeSetup
    dataset: str
    schema: str
    """The encoder's schema fingerprint (for manifests)."""
    prefix: str
    shard_bytes: int
    shard_records: int
    shards: int | None
    """``--shards N``; ``None``: shards cut by size."""
    manifests: bool
    fsync: bool
    workers: int
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Summary:
    """What a run did, counting what earlier runs of the same conversion did."""

    records: int
    dead_letters: int
    shards: int
    shard_bytes: int
    input_bytes: int
    events: int
    seconds: float
    """This run's time."""
    run_records: int
    """Records this run wrote (the others, before it was resumed)."""
    resumed: bool
    directory: str
    dead_letter_path: str


def unit_bytes_for(total: int, shards: int | None) -> int:
    """How large units are: small enough that ``--shards N`` gets several units a shard."""
    if shards is None:
        return UNIT_BYTES
    return min(UNIT_BYTES, max(64 << 10, total // (4 * shards)))


def groups(units: Sequence[Unit], shards: int) -> list[int]:
    """The shard of each unit with ``--shards``: runs of units of about equal input bytes."""
    total = sum(u.bytes for u in units)
    out: list[int] = []
    before = 0
    for u in units:
        out.append(min(shards - 1, before * shards // total) if total else 0)
        before += u.bytes
    return out


def args_of(plan_args: dict[str, Any], files: Sequence[InputFile]) -> dict[str, Any]:
    """The arguments a state is tied to, with the inputs' digest."""
    return plan_args | {"inputs": fingerprint(files), "input_files": len(files)}


def listing(files: Sequence[InputFile]) -> list[list[Any]]:
    """The inputs as a state records them (:attr:`~tfrecordd.convert.runstate.RunState.inputs`)."""
    return [[f.rel, f.size, f.mtime_ns, f.format] for f in files]


def shard_name(plan: Plan, index: int) -> str:
    """The ``index``-th shard's name: ``<prefix>-00000[-of-00010]<suffix>``."""
    suffix = SUFFIXES[plan.setup.compression]
    count = f"-of-{plan.shards:05d}" if plan.shards is not None else ""
    return f"{plan.prefix}-{index:05d}{count}{suffix}"


def _encoded(plan: Plan, units: Sequence[Unit]) -> Iterator[tuple[Unit, list[Batch]]]:
    """Each unit with its batches, in order, encoded by ``plan.workers`` processes."""
    if plan.workers <= 1 or len(units) <= 1:
        init_process(plan.setup, worker=False)
        for u in units:
            yield u, encode_unit(u)
        return
    pool = ProcessPoolExecutor(plan.workers, initializer=init_process, initargs=(plan.setup,))
    try:
        pending: deque[tuple[Unit, Future[list[Batch]]]] = deque()
        todo = iter(units)
        for u in todo:
            pending.append((u, pool.submit(encode_unit, u)))
            if len(pending) >= 2 * plan.workers:
                break
        while pending:
            u, future = pending.popleft()
            batches = future.result()
            if (nxt := next(todo, None)) is not None:
                pending.append((nxt, pool.submit(encode_unit, nxt)))
            yield u, batches
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Run:
    """Writes a plan's shards, resuming from the state in its folder."""

    def __init__(self, plan: Plan, meter: Meter | None, fs: FileSystem = LOCAL) -> None:
        self.plan = plan
        self.fs = fs
        self.meter = meter
        self.output: Output
        if plan.store_config is not None:
            from tfrecordd.outputs.objectstore import FsspecOutput

            self.output = FsspecOutput(plan.store_config, fs, dataset=plan.dataset)
        else:
            self.output = LocalOutput(plan.directory, fs, node_id=NODE_ID, fsync=plan.fsync)
        self.folder = plan.state_folder
        self.state_path = os.path.join(self.folder, runstate.STATE)
        self.resumed = False
        self.records_before = 0
        self._lock: int | None = None
        self._resume_publish = False
        self.shard: OpenShard | None = None
        self.shard_from = (0, 0)

    def prepare(self) -> runstate.RunState:
        """Lock the output, read or start the state, clear what a killed run left."""
        from tfrecordd.errors import OutputError

        os.makedirs(self.folder, exist_ok=True)
        self._lock = runstate.lock(self.folder)
        state = runstate.load(self.state_path)
        if state is not None:
            changed = runstate.differences(state.args, self.plan.args)
            if any(c.startswith("inputs:") for c in changed) and state.inputs:
                files = runstate.input_changes(state.inputs, listing(self.plan.files))
                changed = [c for c in changed if not c.startswith(("inputs:", "input_files:"))]
                changed.append("inputs changed: " + ", ".join(files))
            if changed:
                raise OutputError(
                    self.plan.directory,
                    "holds a conversion run with other arguments or inputs ("
                    + "; ".join(changed)
                    + f"): run it with the same ones to resume it, or remove {self.folder} "
                    "and its shards to start again",
                )
            self.resumed = self._resume_publish = True
        else:
            ours = [n for n in self.output.list_shards("") if _looks_ours(n, self.plan.prefix)]
            if ours:
                raise OutputError(
                    self.plan.directory,
                    f"holds {len(ours)} shard(s) named as convert names its own ({ours[0]}...) "
                    "but no conversion state: convert into an empty directory",
                )
            state = runstate.RunState(self.plan.args, inputs=listing(self.plan.files))
            runstate.save(self.fs, self.state_path, state)
        os.makedirs(self.output.staging_dir, exist_ok=True)
        left = leftovers(self.output.staging_dir, self.output.legacy_dir, NODE_ID)
        for path in left:
            self.fs.remove(path)
        if left and self.plan.fsync:
            self.fs.fsync_dir(self.output.staging_dir)
        return state

    def run(self) -> Summary:
        """Convert (resuming if a state is there); blocking."""
        started = time.monotonic()
        try:
            return self._run(started)
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None

    def _run(self, started: float) -> Summary:
        state = self.prepare()
        self.records_before = state.records
        if self.meter is not None:
            self.meter.done = self.meter.start_done = state.input_bytes
        dead = runstate.DeadLetterFile(
            self.fs, os.path.join(self.folder, runstate.DEAD_LETTERS), state.dead_letter_bytes
        )
        dead.count = state.dead_letters
        try:
            if not state.done:
                self._convert(state, dead)
        finally:
            dead.close()
            if self.shard is not None:
                self.shard.discard()
        return Summary(
            records=state.records,
            dead_letters=state.dead_letters,
            shards=len(state.shards),
            shard_bytes=sum(s["size"] for s in state.shards),
            input_bytes=state.input_bytes,
            events=state.events,
            seconds=time.monotonic() - started,
            run_records=state.records - self.records_before,
            resumed=self.resumed,
            directory=self.plan.directory,
            dead_letter_path=dead.path,
        )

    def _convert(self, state: runstate.RunState, dead: runstate.DeadLetterFile) -> None:
        plan = self.plan
        group = groups(plan.units, plan.shards) if plan.shards is not None else []
        skip_unit, skip = state.next_unit, state.next_batch
        totals = [state.records, state.events, state.input_bytes]
        for unit, batches in _encoded(plan, plan.units[skip_unit:]):
            for i, batch in enumerate(batches):
                if unit.index == skip_unit and i < skip:
                    continue
                at = (unit.index, i)
                if plan.shards is not None:
                    while len(state.shards) < group[unit.index]:
                        self._publish(state, dead, at, totals)
                elif self.shard is not None and not self._fits(self.shard, batch):
                    self._publish(state, dead, at, totals)
                if batch.count:
                    self._open(len(state.shards), at).write(batch.records)
                for d in batch.dead:
                    dead.write(d)
                totals[0] += batch.count
                totals[1] += batch.events
                totals[2] += batch.input_bytes
                if self.meter is not None:
                    self.meter.update(batch.input_bytes, batch.count)
        end = (len(plan.units), 0)
        if plan.shards is not None:
            while len(state.shards) < plan.shards:
                self._publish(state, dead, end, totals)
        elif self.shard is not None:
            self._publish(state, dead, end, totals)
        dead.sync()
        self._record(state, dead, end, totals)
        state.done = True
        runstate.save(self.fs, self.state_path, state)

    def _fits(self, shard: OpenShard, batch: Batch) -> bool:
        cap = self.plan.shard_records
        if cap and shard.records + batch.count > cap:
            return False
        return shard.fits(batch.records)

    def _open(self, index: int, at: tuple[int, int]) -> OpenShard:
        if self.shard is None:
            plan = self.plan
            self.shard = OpenShard(
                self.output.staging_dir,
                shard_name(plan, index),
                plan.setup.compression,
                plan.setup.level,
                plan.shard_bytes if plan.shards is None else _NO_CAP,
                self.fs,
                track_offsets=plan.manifests,
            )
            self.shard_from = at
        return self.shard

    def _publish(
        self,
        state: runstate.RunState,
        dead: runstate.DeadLetterFile,
        at: tuple[int, int],
        totals: list[int],
    ) -> None:
        """Finish the open shard (an empty one, with ``--shards``, if none is open), publish it
        and its manifest, then save the state: the input goes on at ``at``."""
        shard = self._open(len(state.shards), at)
        finished = shard.finish(fsync=self.plan.fsync)
        self.shard = None
        if self._resume_publish:
            # The run before may have published this very shard and been killed before its
            # state was saved: the same bytes under the same name, kept.
            self.output.resume(finished)
            self._resume_publish = False
        else:
            self.output.publish(finished)
        if self.plan.manifests:
            self.output.publish_sidecar(
                manifest.manifest_name(finished.name), self._manifest(finished, at)
            )
        finished.offsets.remove()
        dead.sync()
        state.shards.append(
            {
                "name": finished.name,
                "records": finished.records,
                "size": finished.size,
                "sha256": finished.sha256,
            }
        )
        self._record(state, dead, at, totals)
        runstate.save(self.fs, self.state_path, state)

    def _record(
        self,
        state: runstate.RunState,
        dead: runstate.DeadLetterFile,
        at: tuple[int, int],
        totals: list[int],
    ) -> None:
        state.next_unit, state.next_batch = at
        state.dead_letter_bytes, state.dead_letters = dead.size, dead.count
        state.records, state.events, state.input_bytes = totals

    def _manifest(self, shard: FinishedShard, end: tuple[int, int]) -> Iterator[bytes]:
        plan = self.plan
        first, last = self.shard_from[0], max(end[0] - (end[1] == 0), self.shard_from[0])
        inputs = sorted({f.rel for u in plan.units[first : last + 1] for f in u.files})
        positions = {"convert": {"inputs": inputs, "from": list(self.shard_from), "to": list(end)}}
        return manifest.parts(
            shard=shard.name,
            compression=str(plan.setup.compression),
            records=shard.records,
            size=shard.size,
            sha256=shard.sha256,
            crc=shard.crc32c,
            offsets=shard.offsets.chunks(),
            first_time=None,
            last_time=None,
            schemas={"convert": plan.schema},
            positions=positions,
            dataset=plan.dataset,
        )


def _looks_ours(name: str, prefix: str) -> bool:
    import re

    suffixes = "|".join(re.escape(s) for s in SUFFIXES.values())
    return (
        re.fullmatch(rf"{re.escape(prefix)}-\d{{5}}(-of-\d{{5}})?(?:{suffixes})", name) is not None
    )
