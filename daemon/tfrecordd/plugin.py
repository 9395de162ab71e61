"""The plugin API: sources produce batches of raw events, encoders turn events into records.

A plugin is a pydantic config model that builds the component, registered under an entry point
group (``tfrecordd.sources`` or ``tfrecordd.encoders``) whose name is the ``type`` used in the
config file. The built-ins register exactly the way a third-party package does.

Delivery works by acknowledgement tokens. Each :class:`RawBatch` a source sends carries one
JSON-serializable ``token`` describing the positions it covers. The daemon journals the tokens
with the shard that holds the batch's records, and calls :meth:`Source.ack` with them only after
that shard is published and durable. After a crash, :meth:`Source.recover` receives the folded
state of everything committed and the tokens whose acks must be redone.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

Token = Any
"""A source's JSON-serializable acknowledgement token (positions covered by one batch)."""


@dataclass(slots=True)
class RawEvent:
    """One event as a source read it."""

    payload: bytes
    """The raw bytes (a JSON line, a datagram, a file's content...), kept for dead letters."""
    where: str
    """A human-readable position (``file:offset``, a stream entry ID), for dead letters and logs."""
    value: Any = None
    """An already-structured value (a CSV row as a dict, a file's attributes), if the source has
    one; encoders use it instead of parsing ``payload``."""
    format: str | None = None
    """How to read the event: ``None`` means ``payload`` is one JSON value; ``"csv"`` means
    ``value`` is a row of text fields (header name → string) to convert through the schema;
    ``"file"`` means ``payload`` is a whole file's bytes and ``value`` its attributes
    (``filename``, ``label``: the parent folder's name, ``path``: relative to the spool)."""
    error: str | None = None
    """Set by the source when the event is already known to be bad (e.g. a line over the size
    limit): it goes straight to the dead letters with this reason."""


@dataclass(slots=True)
class RawBatch:
    """A batch of events from one source, with the token that acknowledges all of them."""

    source: str
    events: list[RawEvent]
    token: Token
    """Positions covered; may cover no events (an empty file's end, say) and still needs acking."""


class SourceContext(abc.ABC):
    """What a running source gets from the daemon."""

    name: str
    """The source's configured name."""
    node_id: str
    """This daemon's node id (unique among daemons sharing inputs or outputs)."""
    state_dir: str
    """A directory the source may keep its own files in (created on demand)."""
    max_batch_events: int
    """Never put more events than this in one batch."""
    max_batch_bytes: int
    """Keep the payload bytes of one batch under this (one oversized event may exceed it)."""

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

    @abc.abstractmethod
    async def run(self, ctx: SourceContext) -> None:
        """Read events and ``await ctx.send(batch)`` until cancelled (or the input ends)."""

    @abc.abstractmethod
    async def ack(self, tokens: Sequence[Token]) -> None:
        """Make these positions final (delete spool files, XACK...). Called only after the shard
        holding their records is published and durable. Must be idempotent, and its effect
        durable when it returns: it is redone after a crash that interrupted it."""

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:  # noqa: B027
        """Called once before ``run`` with the folded ``state`` of every finished commit and the
        ``pending`` tokens of commits whose acks may not have completed (redo them)."""

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Fold tokens of finished commits into a compact state (must be idempotent)."""
        del tokens
        return state

    async def aclose(self) -> None:  # noqa: B027
        """Release resources; called once after ``run`` has ended."""


class SourceConfig(BaseModel):
    """Base of every source's config: the keys all sources share."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """The source's name, unique in the config; used in metrics labels, logs and the journal."""
    type: str
    """The plugin that reads this source (an entry point in ``tfrecordd.sources``)."""
    encoder: str
    """The name of the ``[encoders.NAME]`` table that encodes this source's events."""

    delivery: ClassVar[str] = "at-least-once"
    """The delivery guarantee this source gives, end to end (shown by ``tfrecordd plugins``)."""

    def build(self) -> Source:
        """Create the source from this config."""
        raise NotImplementedError


@dataclass(slots=True)
class EncodeResult:
    """What an encoder made of a batch: records, and the events that failed with a reason."""

    records: list[bytes] = field(default_factory=list)
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    """``(index of the event in the batch, reason category, human-readable detail)``."""


class Encoder(abc.ABC):
    """Turns events into serialized records. Runs in the daemon or in worker processes, so it
    must be buildable from its (picklable) config alone."""

    @abc.abstractmethod
    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        """Encode every event; a bad event is reported in ``failures``, never raised."""


class EncoderConfig(BaseModel):
    """Base of every encoder's config."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    type: str
    """The plugin that encodes (an entry point in ``tfrecordd.encoders``)."""

    def build(self) -> Encoder:
        """Create the encoder from this config."""
        raise NotImplementedError

    def feature_description(self) -> dict[str, Any]:
        """The ``tf.io.parse_example`` feature description that reads this encoder's records,
        as plain data (see ``tfrecordd schema``). Encoders that cannot know it raise
        :class:`~tfrecordd.errors.TfrecorddError` saying why."""
        from tfrecordd.errors import TfrecorddError

        raise TfrecorddError(f"the {self.type!r} encoder does not describe its records")

    def schema_fingerprint(self) -> str:
        """A stable digest of what this encoder writes, for shard manifests."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Registry:
    """The installed plugins: ``type`` name to config model."""

    sources: Mapping[str, type[SourceConfig]]
    encoders: Mapping[str, type[EncoderConfig]]
    broken: Mapping[str, str] = field(default_factory=dict)
    """``group:name`` of entry points that failed to load, with the error."""

    @classmethod
    def from_entry_points(cls) -> Registry:
        """Every plugin registered under the ``tfrecordd.*`` entry point groups. A plugin that
        fails to import is left out and reported in ``broken`` (a config naming it then fails
        with that error), so one broken package cannot take the others down."""
        found: dict[str, dict[str, Any]] = {}
        broken: dict[str, str] = {}
        for group in ("tfrecordd.sources", "tfrecordd.encoders"):
            found[group] = {}
            for ep in entry_points(group=group):
                try:
                    found[group][ep.name] = ep.load()
                except Exception as e:
                    broken[f"{group}:{ep.name}"] = f"{type(e).__name__}: {e}"
                    log.warning("plugin %s (%s) failed to load: %s", ep.name, ep.value, e)
        return cls(found["tfrecordd.sources"], found["tfrecordd.encoders"], broken)


AckCallback = Callable[[Sequence[Token]], Awaitable[None]]
