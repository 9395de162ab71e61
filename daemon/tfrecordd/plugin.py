"""The plugin API: sources produce batches of raw events, encoders turn events into records.

A plugin is a pydantic config model that builds the component, registered under an entry point
group (``tfrecordd.sources`` or ``tfrecordd.encoders``) whose name is the ``type`` used in the
config file. The built-ins register exactly the way a third-party package does.

Delivery works by acknowledgement tokens. Each :class:`RawBatch` a source sends carries one
JSON-serializable ``token`` describing the positions it covers. The daemon journals the tokens
(merged by :meth:`Source.compact`) with the shard that holds the batch's records, and calls
:meth:`Source.ack` with them only after that shard is published and durable. After a crash,
:meth:`Source.recover` receives the folded state of everything committed and the tokens whose
acks must be redone.

This module is the whole surface a plugin may import from tfrecordd, with the TFRecord format
(``tfrecordd.format.*``: wire format, framing, compression, the typed compiled helpers of
``tfrecordd.format.compiled``) and the schema API (``tfrecordd.schema.*``). Beside the plugin
types it re-exports what plugins need from the core:

- the errors a plugin raises: :class:`TfrecorddError` (its ``exit_code`` is the daemon's exit
  status when it stops the daemon), :class:`ConfigError`, :class:`EncodeError`,
  :class:`CompressionError`, :class:`DurabilityError` (a failed fsync: it stops the daemon),
  :class:`ListenError` (:func:`listen_failure` words a bind's error and gives its status),
  :class:`SourceLostError`, :class:`StateInUseError`, the statuses ``EXIT_CONFIG``, ``EXIT_IO``;
- the config field types :data:`Duration` (``"30s"`` → seconds) and :data:`Size`
  (``"64MiB"`` → bytes), and :func:`split_host_port` for ``host:port`` keys;
- :class:`FileSystem`, whose instance :attr:`SourceContext.fs` is the daemon's (every fsync of a
  directory a source makes goes through it), :func:`try_lock` (one daemon per folder), and
  :func:`write_atomically`, a small file replaced whole and durably through a ``FileSystem``
  (:func:`sync_folders` before one found at start is trusted);
- ``descriptors``: the process's file-descriptor budget (``take``, ``release``, ``Backoff``),
  which a source that accepts connections shares with the daemon;
- :class:`InputBoundary` (counting into :class:`Refusals`), :func:`refusable` and
  :func:`describe`: the boundary around one input (a file, a stream entry, a connection), so
  that whatever one input raises refuses it and never stops the source (DESIGN invariant 13);
- :class:`Backoff` and :func:`retrying`, the backoff schedule and retry loop of a source that
  reconnects; :func:`token_version` and :class:`TokenVersionError`, for tokens that carry a
  version (``"v"``) so that one of a newer release is refused, never misread; :func:`not_json`,
  the detail of an encoder's ``malformed`` failure of a payload that is not JSON.

A plugin declares on its config class its delivery guarantee (:attr:`SourceConfig.delivery`),
the crash points it passes (:attr:`SourceConfig.crash_points`, reached through
:meth:`SourceContext.crash_point`) and its starter config for ``tfrecordd init``
(:attr:`SourceConfig.sample_config`): the core keeps no table of plugins.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tfrecordd import crashpoints, descriptors
from tfrecordd.boundary import InputBoundary, Refusals, describe, refusable
from tfrecordd.datasets import RouteSection
from tfrecordd.endpoints import split_host_port
from tfrecordd.errors import (
    EXIT_CONFIG,
    EXIT_IO,
    CompressionError,
    ConfigError,
    DurabilityError,
    EncodeError,
    ListenError,
    SourceLostError,
    StateInUseError,
    TfrecorddError,
    TokenVersionError,
    listen_failure,
)
from tfrecordd.events import (
    EncodeResult,
    EventFormat,
    Failure,
    FailureReason,
    Lines,
    RawBatch,
    RawEvent,
    Token,
    not_json,
    token_version,
)
from tfrecordd.fsys import LOCAL, FileSystem, sync_folders, try_lock, write_atomically
from tfrecordd.logs import Repeated
from tfrecordd.retry import Backoff, retrying
from tfrecordd.units import Duration, Size

__all__ = [
    "EXIT_CONFIG",
    "EXIT_IO",
    "Backoff",
    "CompressionError",
    "ConfigError",
    "DirectoryUse",
    "DurabilityError",
    "Duration",
    "EncodeError",
    "EncodeResult",
    "Encoder",
    "EncoderConfig",
    "EventFormat",
    "Failure",
    "FailureReason",
    "FileSystem",
    "InputBoundary",
    "Lines",
    "ListenError",
    "RawBatch",
    "RawEvent",
    "Refusals",
    "Registry",
    "Size",
    "Source",
    "SourceConfig",
    "SourceContext",
    "SourceLostError",
    "SourceState",
    "StateInUseError",
    "TfrecorddError",
    "Token",
    "TokenVersionError",
    "describe",
    "descriptors",
    "listen_failure",
    "not_json",
    "refusable",
    "retrying",
    "split_host_port",
    "sync_folders",
    "token_version",
    "try_lock",
    "write_atomically",
]

if TYPE_CHECKING:
    from tfrecordd.schema import ExampleSchema, SequenceSchema

log = logging.getLogger(__name__)


class SourceState:
    """Whether a running source serves, as it tells :meth:`SourceContext.mark_down` and
    :meth:`SourceContext.mark_up`: up while nothing of it is down (so a source that never tells
    is up). Each trouble is logged when it begins, at most once a minute after, and at its end."""

    def __init__(
        self,
        name: str,
        *,
        on_change: Callable[[SourceState, str | None], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.down: dict[str, tuple[str, float]] = {}
        """What is down (``reading``, ``acking``...): the last reason, since when (Unix time)."""
        self.since = clock()
        """Unix time the source last went up or down."""
        self.reconnects = 0
        """Attempts to bring back what was down (each failed retry, and the one that worked)."""
        self.last_error, self.last_error_at = "", 0.0
        self._on_change = on_change
        self._clock = clock
        self._logs: dict[str, Repeated] = {}

    @property
    def up(self) -> bool:
        """Whether nothing of the source is down."""
        return not self.down

    def mark_down(self, reason: str, what: str) -> None:
        """See :meth:`SourceContext.mark_down`."""
        now = self._clock()
        if what in self.down:
            self.reconnects += 1
        elif not self.down:
            self.since = now
        self.down[what] = (reason, self.down.get(what, (reason, now))[1])
        self.last_error, self.last_error_at = reason, now
        repeated = self._logs.setdefault(what, Repeated(log, clock=self._clock))
        repeated.warning("source %s: %s failed: %s", self.name, what, reason)
        if self._on_change is not None:
            self._on_change(self, what)

    def mark_up(self, what: str) -> None:
        """See :meth:`SourceContext.mark_up`."""
        if self.down.pop(what, None) is not None:
            self.reconnects += 1
            self.since = self.since if self.down else self._clock()
            self._logs[what].ended("source %s: %s works again", self.name, what)
            if self._on_change is not None:
                self._on_change(self, None)

    def down_for(self, what: str) -> float:
        """Seconds ``what`` has been down (0 while it is not)."""
        return self._clock() - self.down[what][1] if what in self.down else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The state as plain data (``/readyz``'s body)."""
        down = {w: {"reason": r, "since": t} for w, (r, t) in sorted(self.down.items())}
        return {"up": self.up, "since": self.since, "down": down, "reconnects": self.reconnects,
                "last_error": self.last_error, "last_error_at": self.last_error_at}  # fmt: skip


class SourceContext(abc.ABC):
    """What a running source gets from the daemon."""

    name: str
    """The source's configured name."""
    node_id: str
    """This daemon's node id (unique among daemons sharing inputs or outputs)."""
    state_dir: str
    """The source's own folder for its files (``<state_dir>/sources/<name>``): made, durable in
    its parents, before the source recovers; a file written there needs only this folder's fsync."""
    max_batch_events: int
    """Never put more events than this in one batch."""
    max_batch_bytes: int
    """Keep the payload bytes of one batch under this (one oversized event may exceed it)."""
    fs: FileSystem = LOCAL
    """The daemon's file system: a source makes its own renames and deletions durable with
    ``fs.fsync_dir`` / ``fs.fsync_dir_fd`` (tests swap in one that fails or cuts the power)."""

    _state: SourceState | None = None

    @property
    def source_state(self) -> SourceState:
        """This source's :class:`SourceState`, as :meth:`mark_down` and :meth:`mark_up` set it."""
        if self._state is None:
            self._state = SourceState(self.name)
        return self._state

    def mark_down(self, reason: str, *, what: str = "reading") -> None:
        """Say, at every failed attempt, that the source cannot do ``what`` (``reading``: its
        server or input is out of reach; ``acking``: published positions cannot be acknowledged;
        ``accepting``: its clients cannot connect) and why: it is not ready until
        :meth:`mark_up` with the same ``what`` (each repeat counts as a reconnect attempt)."""
        self.source_state.mark_down(reason, what)

    def mark_up(self, *, what: str = "reading") -> None:
        """Say that ``what`` works again (nothing happens if it was not down): call it after
        every attempt that worked."""
        self.source_state.mark_up(what)

    def crash_point(self, point: str) -> None:
        """Pass the crash point ``point`` (declared in the config class's
        :attr:`SourceConfig.crash_points`): with ``TFRECORDD_CRASH_AT=point`` set, the process
        exits here as if killed (the crash tests); otherwise nothing happens."""
        crashpoints.reached(point)

    @abc.abstractmethod
    async def send(self, batch: RawBatch) -> None:
        """Hand a batch to the pipeline; waits while the pipeline is full (backpressure)."""

    @abc.abstractmethod
    def count_dropped(self, reason: str, n: int = 1) -> None:
        """Count events dropped on purpose (a full pipeline for a source that cannot wait)."""

    @abc.abstractmethod
    def count_refused(self, reason: str, n: int = 1) -> None:
        """Count inputs refused before they became events (a symlink in a spool directory)."""


class Source(abc.ABC):
    """A running source. ``run`` reads until cancelled; ``ack`` makes positions final."""

    def attach(self, ctx: SourceContext) -> None:  # noqa: B027
        """Called once, before :meth:`recover`, :meth:`ack` or :meth:`run`, with the context
        ``run`` will get: a source that needs the daemon's file system or its crash points in
        ``recover`` or ``ack`` (which take no context) keeps it from here."""

    @abc.abstractmethod
    async def run(self, ctx: SourceContext) -> None:
        """Read events and ``await ctx.send(batch)`` until cancelled (or the input ends)."""

    @abc.abstractmethod
    async def ack(self, tokens: Sequence[Token]) -> None:
        """Make these positions final (delete spool files, XACK...). Called only after the shard
        holding their records is published and durable. Must be idempotent, and its effect
        durable when it returns: it is redone after a crash that interrupted it. A source whose
        positions can live only in the journal (what :meth:`fold` keeps, handed back to
        :meth:`recover`) may do nothing here (``check_source(final_ack=False)``)."""

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:  # noqa: B027
        """Called once before ``run`` with the folded ``state`` of every finished commit and the
        ``pending`` tokens of commits whose acks may not have completed (redo them)."""

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Fold the tokens of a finished commit into a compact state. Called once per commit,
        in commit order, so folding two commits one after the other must give what folding
        their tokens together would; and idempotent (a commit may be folded again after a
        crash)."""
        del tokens
        return state

    @staticmethod
    def compact(tokens: list[Token]) -> list[Token]:
        """Merge the tokens of one commit into fewer. The daemon calls it as the open shard
        takes batches (with the tokens so far, the newest last, each time their count has doubled
        since the last call), so that a shard's tokens stay few in memory and in the journal. Must
        cover exactly what ``tokens`` do: acking the result acks what acking ``tokens`` would,
        and folding it gives what folding them would; and compacting again changes nothing.
        Default: ``tokens`` as they are."""
        return tokens

    async def aclose(self) -> None:  # noqa: B027
        """Release resources; called once after ``run`` has ended."""


class SourceConfig(BaseModel):
    """Base of every source's config: the keys all sources share."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """The source's name, unique in the config; used in metrics labels, logs and the journal."""
    type: str
    """The plugin that reads this source (an entry point in ``tfrecordd.sources``)."""
    dataset: str | None = None
    """The ``[datasets.NAME]`` every event of this source goes to (or see ``route``)."""
    route: RouteSection | None = None
    """Send each event to the dataset named by the value of one of its fields, instead of one
    ``dataset`` for all."""
    encoder: str | None = None
    """The older form, with one ``[output]`` and no ``[datasets]``: the ``[encoders.NAME]``
    table that encodes this source's events."""

    delivery: ClassVar[str] = "at-least-once"
    """The delivery guarantee this source gives, end to end (shown by ``tfrecordd plugins``)."""
    crash_points: ClassVar[tuple[str, ...]] = ()
    """The crash points this source passes (:meth:`SourceContext.crash_point`), each a name
    ``TFRECORDD_CRASH_AT`` may arm, besides the daemon's own."""
    sample_config: ClassVar[str] = ""
    """The ``[[sources]]`` table ``tfrecordd init --source TYPE`` writes for this source (empty:
    ``init`` offers no starter config for it). It names the starter config's encoder
    (``encoder = "events"``), a line ``init`` turns into the starter's route between its two
    datasets, and may use ``{spool}`` (a directory for it under the
    starter config's base directory, as a TOML string) and ``{sample}`` (a sample JSON event);
    it is filled in with :meth:`str.format`, so a literal brace is written twice (``{{``)."""
    sample_try: ClassVar[str] = ""
    """A shell command that feeds ``{sample}`` to the source as :attr:`sample_config` sets it up
    (``{spool_dir}``: that directory, unquoted, where the source may keep or read its input),
    printed by ``init``; literal braces doubled as in :attr:`sample_config`."""

    def build(self) -> Source:
        """Create the source from this config."""
        raise NotImplementedError

    def directories(self) -> list[DirectoryUse]:
        """The local directories this source reads or writes, for the start-up check that no
        two uses overlap in a way that loses or loops data (``tfrecordd.pathcheck``)."""
        return []


@dataclass(frozen=True, slots=True)
class DirectoryUse:
    """A local directory a source uses, and how."""

    key: str
    """The config key that names it (``path``, ``done_dir``), for error messages."""
    path: Path
    role: Literal["input", "output"]
    """``input``: the source reads the files it finds there (and removes them);
    ``output``: the source puts files there that it must never read again."""
    recursive: bool = False
    """For an input: whether sub-folders are read too."""
    renamed_from: str | None = None
    """For an output: the key of the input its files are renamed from (so both must be on one
    file system)."""


class Encoder(abc.ABC):
    """Turns events into serialized records. Runs in the daemon or in worker processes, so it
    must be buildable from its (picklable) config alone."""

    parses_json: ClassVar[bool] = False
    """Whether every plain payload it is given (an event with no ``format`` and no ``value``, a
    line) is parsed as JSON, one that is not failing as ``malformed`` with :func:`not_json`'s
    detail: a route into it then reads its field without checking the rest of the payload."""

    @abc.abstractmethod
    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        """Encode every event; a bad event is reported in ``failures``, never raised. (Should
        it raise all the same, the daemon encodes the batch's events one at a time, and those it
        still raises on are dead-lettered with the reason ``encoder-error``.)"""

    def encode_lines(self, payloads: list[bytes]) -> EncodeResult:
        """Encode events that are each one JSON value (the lines of a :class:`Lines`), as
        :meth:`encode_batch` would; ``failures`` index ``payloads``. Override it to skip making
        a :class:`RawEvent` per line."""
        return self.encode_batch([RawEvent(p, "") for p in payloads])


class EncoderConfig(BaseModel):
    """Base of every encoder's config."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    type: str
    """The plugin that encodes (an entry point in ``tfrecordd.encoders``)."""

    def build(self) -> Encoder:
        """Create the encoder from this config."""
        raise NotImplementedError

    def declared_schema(self) -> ExampleSchema | SequenceSchema | None:
        """The declared schema this encoder writes its records by, or ``None`` if it has none.
        ``tfrecordd schema`` describes a declared schema itself; for an encoder without one it
        asks :meth:`feature_description`."""
        return None

    def feature_description(self) -> dict[str, Any]:
        """The ``tf.io.parse_example`` feature description that reads this encoder's records,
        as plain data (see ``tfrecordd schema``), for an encoder without a
        :meth:`declared_schema`. Encoders that cannot know it raise
        :class:`~tfrecordd.errors.TfrecorddError` saying why."""
        if self.declared_schema() is not None:
            raise TfrecorddError(
                f"the {self.type!r} encoder's records are described from its declared schema: "
                "`tfrecordd schema`, or tfrecordd.cli.describe.describe_encoder"
            )
        raise TfrecorddError(f"the {self.type!r} encoder does not describe its records")

    def schema_fingerprint(self) -> str:
        """A stable digest of what this encoder writes, for shard manifests."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class EntryPoints(Mapping[str, Any]):
    """One entry point group's plugins by name, each imported when first asked for: a daemon
    imports only the plugins its config names (a spool directory never imports the Redis
    client), and starts that much sooner. A plugin that fails to import is missing from the
    mapping and its error is recorded in ``broken``; iterating the mapping imports them all."""

    def __init__(self, group: str, broken: dict[str, str]) -> None:
        self._group = group
        self._points = {ep.name: ep for ep in entry_points(group=group)}
        self._loaded: dict[str, Any] = {}
        self._broken = broken

    def __getitem__(self, name: str) -> Any:
        if name in self._loaded:
            return self._loaded[name]
        ep = self._points[name]
        key = f"{self._group}:{name}"
        if key in self._broken:
            raise KeyError(name)
        try:
            model = ep.load()
        except Exception as e:
            self._broken[key] = f"{type(e).__name__}: {e}"
            log.warning("plugin %s (%s) failed to load: %s", ep.name, ep.value, e)
            raise KeyError(name) from None
        self._loaded[name] = model
        return model

    def __iter__(self) -> Iterator[str]:
        return iter([name for name in self._points if name in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class Registry:
    """The installed plugins: ``type`` name to config model."""

    sources: Mapping[str, type[SourceConfig]]
    encoders: Mapping[str, type[EncoderConfig]]
    broken: Mapping[str, str] = field(default_factory=dict)
    """``group:name`` of entry points that failed to load, with the error: of those asked for
    by name so far (iterating ``sources`` or ``encoders`` asks for every one)."""

    @classmethod
    def from_entry_points(cls) -> Registry:
        """Every plugin registered under the ``tfrecordd.*`` entry point groups, imported when
        first looked up (:class:`EntryPoints`). A plugin that fails to import is left out and
        reported in ``broken`` (a config naming it then fails with that error), so one broken
        package cannot take the others down."""
        broken: dict[str, str] = {}
        return cls(
            EntryPoints("tfrecordd.sources", broken),
            EntryPoints("tfrecordd.encoders", broken),
            broken,
        )

    def crash_points(self) -> tuple[str, ...]:
        """Every crash point ``TFRECORDD_CRASH_AT`` may arm: the daemon's, in protocol order,
        then those the registered sources declare."""
        points = list(crashpoints.POINTS)
        for model in self.sources.values():
            points += [p for p in model.crash_points if p not in points]
        return tuple(points)
