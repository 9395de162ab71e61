"""The boundary around one input: whatever one file, stream entry or connection raises stays
with it.

A source handles each input (a spool file, a stream entry, a client connection) inside an
:class:`InputBoundary`. An exception raised there, by the source's own reading, decoding or
finishing code or by a library it calls, is caught at the boundary: the input is refused with
the exception as its reason (counted under the boundary's label and logged with its traceback),
and the source goes on with the next input. What the boundary lets through is what must stop
the daemon whatever input it came from (:func:`refusable`): cancellation, a failed fsync
(:class:`~tfrecordd.errors.DurabilityError`), a lock held by another daemon, memory running
out, a pipeline that closed under a send (:class:`PipelineClosedError`: the daemon is
stopping). The source decides what refusing means for its kind of input (the file moved aside,
the entry dead-lettered, the connection closed with an error); the boundary makes sure the
choice is made at all.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Protocol

import anyio

from tfrecordd.errors import DurabilityError, StateInUseError, TokenVersionError

__all__ = [
    "FATAL",
    "InputBoundary",
    "PipelineClosedError",
    "Refusals",
    "describe",
    "refusable",
]

log = logging.getLogger(__name__)


class PipelineClosedError(anyio.BrokenResourceError):
    """:meth:`~tfrecordd.plugin.SourceContext.send` found the pipeline closed: the daemon is
    stopping (for a reason of its own, reported elsewhere). No input's fault: never refused."""


FATAL: tuple[type[BaseException], ...] = (
    PipelineClosedError,
    DurabilityError,
    StateInUseError,
    TokenVersionError,
    MemoryError,
)
"""Exceptions that stop the daemon wherever they are raised: refusing one input would not make
them pass, and going on could break a promise (an fsync that failed, a second daemon)."""


class Refusals(Protocol):
    """Where an :class:`InputBoundary` counts a refusal: a
    :class:`~tfrecordd.plugin.SourceContext`, or anything with its ``name`` and
    ``count_refused``."""

    name: str

    def count_refused(self, reason: str, n: int = 1) -> None: ...


def refusable(error: BaseException) -> bool:
    """Whether ``error``, raised while handling one input, refuses that input (``True``) or
    must stop the daemon (cancellation, :data:`FATAL`; a group of errors, as a task group
    raises, only if each of them is refusable)."""
    if isinstance(error, BaseExceptionGroup):
        return isinstance(error, Exception) and all(map(refusable, error.exceptions))
    return isinstance(error, Exception) and not isinstance(error, FATAL)


def describe(error: BaseException) -> str:
    """``error`` as a one-line reason: its type and message."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class InputBoundary:
    """``with InputBoundary(ctx, "file x.csv", "read_error") as b:`` handles one input; after
    the block, :attr:`error` is the refusable exception it raised (``None`` if none), already
    counted under ``label`` and logged, and the caller refuses the input with :attr:`reason`.

    Usable around ``await``: it is a plain context manager, entered and left in one task."""

    def __init__(self, ctx: Refusals, what: str, label: str) -> None:
        self.ctx = ctx
        self.what = what
        """The input, as the log names it (``file a.csv``, ``connection 127.0.0.1:5000``)."""
        self.label = label
        """The ``reason`` label of ``tfrecordd_inputs_refused_total``."""
        self.error: BaseException | None = None
        """The exception the block raised and the boundary caught."""

    @property
    def reason(self) -> str:
        """Why the input is refused (empty when nothing was caught)."""
        return "" if self.error is None else f"unexpected error: {describe(self.error)}"

    def __enter__(self) -> InputBoundary:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if error is None or not refusable(error):
            return False
        self.error = error
        self.ctx.count_refused(self.label)
        log.error("%s: %s refused: %s", self.ctx.name, self.what, self.reason, exc_info=error)
        return True
