"""Live config reload (SIGHUP): the config file read again, validated whole, and applied to
the running daemon without a gap (:class:`Reloader`).

What a reload changes live, and how (:func:`plan_reload` decides, :meth:`Reloader.reload`
applies):

- a source whose settings are the same keeps running, untouched;
- a changed source is stopped alone (it stops reading; what it sent goes through the pipeline
  and is acknowledged as usual), then started again with its new settings from the position
  the journal holds for it; a ``tcp``, ``udp`` or ``unix`` source that listens where it did
  hands its listening socket to its new instance (:class:`ListenerHandover`), so clients
  connecting meanwhile wait in the socket's backlog (datagrams in its buffer), none refused;
- a removed source is stopped the same way; a new one starts;
- a dataset whose shard limits change (:data:`LIVE_DATASET_KEYS`, in ``[datasets.NAME]`` or
  ``[output]``), or whose encoder's settings change, takes them once every source feeding it
  has been stopped that way; those sources then start again;
- ``[daemon] drain_timeout`` applies at once.

While a source is stopped for a reload, every open shard is published (as SIGUSR1 does), so
that the positions of everything it sent are committed and acknowledged before its new
instance reads on from them: nothing acknowledged is lost, nothing is written twice. The other
sources do not pause.

Every other key (the ``[daemon]`` section but ``drain_timeout``, ``[metrics]``, the datasets'
and ``[output]``'s other keys, datasets or encoders added or removed, a source's type) cannot
change while the daemon runs: a reload
that changes one fails with a line naming each, and the running config stays as it was. An
invalid file fails the same way, each error on a line of its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel

from tfrecordd.config import DaemonConfig, load_config
from tfrecordd.errors import ConfigError, DurabilityError
from tfrecordd.pipeline.datasets import manifest_writers
from tfrecordd.pipeline.encodeplan import EncodePlan, plan_encoding
from tfrecordd.plugin import Source
from tfrecordd.state.reading import read_checkpoint

if TYPE_CHECKING:
    from tfrecordd.pipeline.runtime import Daemon

__all__ = [
    "LIVE_DAEMON_KEYS",
    "LIVE_DATASET_KEYS",
    "ListenerHandover",
    "ReloadPlan",
    "Reloader",
    "plan_reload",
]

log = logging.getLogger("tfrecordd")

LIVE_DAEMON_KEYS = frozenset({"drain_timeout"})
"""The keys of ``[daemon]`` a reload may change."""

LIVE_DATASET_KEYS = frozenset(
    {"max_shard_bytes", "max_shard_records", "max_shard_age", "max_open_shards", "min_free_bytes"}
)
"""The keys of a dataset (or of ``[output]``) a reload may change: its shards' limits."""

POLL = 0.02
"""Seconds between two looks at the pipeline while a reload waits for a source's batches."""


@runtime_checkable
class ListenerHandover(Protocol):
    """A source that can take over the listening socket of the instance it replaces."""

    def take_listener(self, old: Source) -> bool:
        """Take ``old``'s listening socket if ``old`` listens where this source would (then
        ``old`` no longer closes it); whether it did."""
        ...


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What a reload changes: sources by name, and the lines of what cannot change live."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """One line per key that cannot change while the daemon runs."""
    settings: list[str] = field(default_factory=list)
    """The live settings that change (``daemon.drain_timeout``)."""
    datasets: list[str] = field(default_factory=list)
    """Datasets whose shard limits (:data:`LIVE_DATASET_KEYS`) or encoder change."""

    @property
    def unchanged(self) -> bool:
        """Whether the new config says what runs already."""
        return not (
            self.added
            or self.changed
            or self.removed
            or self.refused
            or self.settings
            or self.datasets
        )

    def summary(self) -> str:
        """What the plan does, in a few words."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("sources added:", self.added),
                ("restarted:", self.changed),
                ("removed:", self.removed),
                ("datasets:", self.datasets),
                ("settings:", self.settings),
            )
            if names
        ]
        return "; ".join(parts) or "nothing changed"


def plan_reload(old: DaemonConfig, new: DaemonConfig) -> ReloadPlan:
    """What applying ``new`` to a daemon running ``old`` takes (see the module's docstring)."""
    refused: list[str] = []
    settings: list[str] = []
    for key in _changed_keys(old.daemon, new.daemon):
        (settings if key in LIVE_DAEMON_KEYS else refused).append(f"daemon.{key}")
    refused += [f"metrics.{k}" for k in _changed_keys(old.metrics, new.metrics)]
    if old.output is None or new.output is None:
        refused += [] if old.output == new.output else ["output"]
    else:
        keys = _changed_keys(old.output, new.output)
        refused += [f"output.{k}" for k in keys if k not in LIVE_DATASET_KEYS]
    datasets: list[str] = []
    for name, keys in _changed_entries(old.datasets, new.datasets).items():
        bad = [k for k in keys if k not in LIVE_DATASET_KEYS]
        if not keys:
            refused.append(f"datasets.{name} ({'added' if name in new.datasets else 'removed'})")
        elif not bad:
            datasets.append(name)
        elif old.output is None:  # the older form names them under [output], above
            refused += [f"datasets.{name}.{k}" for k in bad]
    encoders = list(_changed_entries(old.encoders, new.encoders))
    for name in encoders:
        if name not in old.encoders or name not in new.encoders:
            refused.append(f"encoders.{name} ({'added' if name in new.encoders else 'removed'})")
    encoded = {n for n, d in new.datasets.items() if d.encoder in encoders}
    was = {s.name: s for s in old.sources}
    now = {s.name: s for s in new.sources}
    changed: list[str] = []
    for i, source in enumerate(new.sources):
        before = was.get(source.name)
        if before is None:
            continue
        if before.type != source.type:
            refused.append(f"sources[{i}].type (source {source.name}: {before.type} before)")
        elif before != source or set(old.fed_datasets(before)) & {*datasets, *encoded}:
            # A source feeding a dataset whose settings or encoder change is restarted with it.
            changed.append(source.name)
    return ReloadPlan(
        added=[n for n in now if n not in was],
        changed=changed,
        removed=[n for n in was if n not in now],
        datasets=sorted({*datasets, *encoded}),
        refused=[
            f"{key}: cannot change while the daemon runs; restart to change it" for key in refused
        ],
        settings=settings,
    )


def _changed_keys(old: BaseModel, new: BaseModel) -> list[str]:
    a, b = old.model_dump(), new.model_dump()
    return [k for k in {**a, **b} if a.get(k) != b.get(k)]


def _changed_entries(
    old: Mapping[str, BaseModel], new: Mapping[str, BaseModel]
) -> dict[str, list[str]]:
    """Per entry that differs, its keys that do (none: added, removed, or of another type)."""
    out: dict[str, list[str]] = {}
    for name in {**old, **new}:
        a, b = old.get(name), new.get(name)
        if a is None or b is None or type(a) is not type(b):
            out[name] = []
        elif a != b:
            out[name] = _changed_keys(a, b)
    return out


class ReloadRefusedError(Exception):
    """The new config cannot be applied; ``lines`` say why. Nothing was changed, unless
    ``partly`` (a source could not start, the rest of the config applied)."""

    def __init__(self, lines: list[str], *, partly: bool = False) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.partly = partly


class Reloader:
    """Reloads ``daemon``'s config when asked (:meth:`request`), one reload at a time: a
    request made while one runs is served by one more reload after it (never lost, never
    queued more than once)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._wanted = anyio.Event()

    def request(self) -> None:
        """Reload as soon as the one running (if any) ends."""
        self._wanted.set()

    async def run(self) -> None:
        """Serve requests until cancelled (a task of the daemon's services)."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            await self.reload()

    async def reload(self) -> str:
        """Read the config file again and apply it; the result (``applied``, ``unchanged``,
        ``failed``), counted in ``tfrecordd_config_reloads_total``."""
        d = self.daemon
        if d.config_path is None:
            log.error("reload: failed: the daemon was started without a config file to read")
            return self._count("failed")
        log.info("reload: reading %s", d.config_path)
        d.notifier.reloading(f"reloading {d.config_path}")
        try:
            result = await self._reload(d.config_path)
        finally:
            d.notifier.ready(f"running {len(d.sources)} source(s)")
        return self._count(result)

    def _count(self, result: str) -> str:
        metrics = self.daemon.metrics
        metrics.config_reloads.labels(result).inc()
        if result == "applied":
            metrics.config_reload_success.set(time.time())
        return result

    async def _reload(self, path: str) -> str:
        d = self.daemon
        try:
            new = await anyio.to_thread.run_sync(load_config, path)
        except ConfigError as e:
            for line in e.errors:
                log.error("reload: failed: %s", line)
            log.error("reload: failed: %s is invalid; the running config is kept", path)
            return "failed"
        plan = plan_reload(d.config, new)
        try:
            if plan.refused:
                raise ReloadRefusedError(plan.refused)
            if plan.unchanged:
                log.info("reload: %s says what runs already: nothing to do", path)
                return "unchanged"
            await self._apply(new, plan)
        except ReloadRefusedError as e:
            for line in e.lines:
                log.error("reload: failed: %s", line)
            if not e.partly:
                log.error("reload: failed: the running config is kept")
            return "failed"
        log.info("reload: applied (%s)", plan.summary())
        return "applied"

    async def _apply(self, new: DaemonConfig, plan: ReloadPlan) -> None:
        d = self.daemon
        starting = [*plan.added, *plan.changed]
        encode_plan = plan_encoding(new)
        if refused := d.encode.refusals(encode_plan, starting):
            raise ReloadRefusedError(refused)
        configs = {s.name: s for s in new.sources}
        built = {name: configs[name].build() for name in starting}
        if d.sources_tg is None:
            raise ReloadRefusedError(["the sources are not running (starting or stopping)"])
        # Held open while no source runs between the old ones' end and the new ones' start:
        # the pipeline ends when its last source does.
        held = anyio.Event()
        d.sources_tg.start_soon(held.wait)
        try:
            await self._swap(new, plan, built, encode_plan)
        finally:
            held.set()

    async def _swap(
        self,
        new: DaemonConfig,
        plan: ReloadPlan,
        built: dict[str, Source],
        encode_plan: EncodePlan,
    ) -> None:
        d = self.daemon
        starting = [*plan.added, *plan.changed]
        stopping = [*plan.changed, *plan.removed]
        configs = {s.name: s for s in new.sources}
        for name in plan.changed:
            src = built[name]
            if isinstance(src, ListenerHandover) and src.take_listener(d.sources[name]):
                log.info("reload: source %s keeps its listening socket", name)
        async with anyio.create_task_group() as tg:
            for name in stopping:
                tg.start_soon(d.stop_source, name)
        states = await self._drain(stopping, built)
        for name in stopping:
            try:
                await d.sources[name].aclose()
            except Exception:
                log.exception("reload: source %s: error while closing", name)
            log.info("reload: source %s stopped", name)
        d.config = new
        failed: list[str] = []
        for name in plan.removed:
            del d.sources[name], d.contexts[name]
        manifests = manifest_writers(new, d.outputs)
        for name in plan.datasets:
            # Every source writing to it stopped and its shards published: none is open.
            d.write.datasets[name] = replace(d.write.datasets[name], config=new.datasets[name])
            if name in manifests:
                d.committer.manifests[name] = manifests[name]
        d.encode.use(encode_plan, starting, plan.removed)
        for name in starting:
            src = built[name]
            d.folds[name] = type(src).fold
            d.source_types[name] = configs[name].type
            d.attach(name, src)
            # Counted on from what the write stage took of the instances before it: a reload
            # waits until it has taken every batch sent.
            d.contexts[name].sent = d.write.taken.get(name, 0)
            try:
                await anyio.to_thread.run_sync(d.contexts[name].make_state_dir)
                await src.recover(states.get(name), [])
            except DurabilityError:
                raise  # a failed fsync is never retried: it stops the daemon
            except Exception as e:
                failed.append(f"source {name}: cannot start: {e}")
                del d.sources[name], d.contexts[name]
                with contextlib.suppress(Exception):
                    await src.aclose()
                continue
            if d.start_source(name):
                log.info("reload: source %s started", name)
        if failed:
            # Left out of the config that runs: the next reload starts them as new sources.
            running = [s for s in new.sources if s.name in d.sources]
            d.config = new.model_copy(update={"sources": running})
            raise ReloadRefusedError(
                [*failed, "the other changes are applied; fix the config and reload again"],
                partly=True,
            )

    async def _drain(self, stopping: list[str], starting: Mapping[str, Source]) -> dict[str, Any]:
        """Wait until every batch the ``stopping`` sources sent is committed and acknowledged
        (every open shard published); the journal's state of each ``starting`` source."""
        d = self.daemon
        for name in stopping:
            sent = d.contexts[name].sent
            while d.write.taken.get(name, 0) < sent:  # noqa: ASYNC110 (no event to wait for)
                await anyio.sleep(POLL)
        seen = d.write.flushes
        d.write.request_flush()
        while d.write.flushes == seen:  # noqa: ASYNC110
            await anyio.sleep(POLL)
        if not starting:
            return {}
        # The gate holds off the next commit: the journal is compacted between two, and the
        # checkpoint then holds every acknowledged position.
        async with d.write.commit_gate:
            await anyio.to_thread.run_sync(d.journal.compact)
            ckpt = await anyio.to_thread.run_sync(read_checkpoint, d.journal.checkpoint_path)
        if ckpt is None:
            return {}
        states = {n: ckpt.sources[n] for n in starting if n in ckpt.sources}
        for name, src in starting.items():
            if tokens := ckpt.unfolded.get(name):
                # Positions of a source known before but not configured since.
                states[name] = type(src).fold(states.get(name), tokens)
        return states
