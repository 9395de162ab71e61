"""One change to ``state_dir`` made of several files, committed at once: what the ``tfrecordd
state`` commands write.

A :class:`Change` lists its steps: new content for a file (:meth:`Change.write`), a file or
folder renamed (:meth:`Change.rename`), a file kept under a second name (:meth:`Change.link`).
:meth:`Change.apply` writes every new content aside (``.change.NAME``) and fsyncs it, then
commits the change by renaming its description into place as :data:`MARKER`: before that
rename nothing the daemon reads has changed, after it the change is made whatever happens. The
steps are then done in order, each an atomic rename or link that tells from the files alone
whether it is done, and the marker is removed once they are durable.

A change killed after its commit is finished by :func:`finish`: every state command calls it
first, and so does the daemon's start (:meth:`~tfrecordd.state.journal.Journal.recover`);
``state check`` reads the state as the change leaves it (:meth:`Change.view`). A change killed
before its commit leaves only files aside, which the next change removes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Literal, cast

import orjson

from tfrecordd import crashpoints
from tfrecordd.errors import StateError
from tfrecordd.fsys import LOCAL, read_nofollow, write_atomically, write_file
from tfrecordd.state.records import STATE_FORMAT, damage_advice, newer_format_error

__all__ = ["MARKER", "Change", "Step", "finish", "pending"]

MARKER = "change.json"
"""A committed change not yet finished, in ``state_dir``."""
ASIDE = ".change."
"""How every file a change writes aside begins (with the marker's own temporary file)."""

Op = Literal["write", "rename", "link"]


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a change; paths are relative to ``state_dir``."""

    op: Op
    src: str
    """For ``write``, the new content's file aside."""
    dst: str

    def done(self, state_dir: str) -> bool:
        """Whether this step is done, from the files alone: the file aside of a ``write`` is
        gone, the source of a ``rename`` is gone, the second name of a ``link`` exists. (A
        change never renames a path that one of its later steps creates, nor links to a name
        that existed before it.)"""
        if self.op == "link":
            return os.path.lexists(os.path.join(state_dir, self.dst))
        return not os.path.lexists(os.path.join(state_dir, self.src))

    def do(self, state_dir: str) -> None:
        """Do this step (once it is not :meth:`done`)."""
        src, dst = os.path.join(state_dir, self.src), os.path.join(state_dir, self.dst)
        if self.op == "link":
            os.link(src, dst, follow_symlinks=False)
        else:
            os.replace(src, dst)


@dataclass(slots=True)
class Change:
    """Steps that take ``state_dir`` from one sound state to the next, done all or none."""

    command: list[str]
    """The ``tfrecordd state`` command that made it, as typed (``["rename-source", "a", "b"]``)."""
    steps: list[Step] = field(default_factory=list)
    _contents: dict[str, bytes] = field(default_factory=dict)

    def write(self, name: str, data: bytes) -> None:
        """Give file ``name`` the content ``data``."""
        aside = ASIDE + name.replace("/", "_")
        self._contents[aside] = data
        self.steps.append(Step("write", aside, name))

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` (a file or a folder) to ``dst``."""
        self.steps.append(Step("rename", src, dst))

    def link(self, src: str, dst: str) -> None:
        """Keep file ``src`` under the name ``dst`` too (``dst`` must not exist)."""
        self.steps.append(Step("link", src, dst))

    @property
    def text(self) -> str:
        """The command, as an operator would type it."""
        return "tfrecordd state " + " ".join(self.command)

    def apply(self, state_dir: str) -> None:
        """Make the change: write every new content aside, commit, do the steps, finish."""
        if not self.steps:
            return
        _remove_aside(state_dir)
        for aside, data in self._contents.items():
            write_file(LOCAL, os.path.join(state_dir, aside), [data], fsync=True)
        LOCAL.fsync_dir(state_dir)
        crashpoints.reached("state-staged")
        description = {
            "version": STATE_FORMAT,
            "command": self.command,
            "steps": [[s.op, s.src, s.dst] for s in self.steps],
        }
        write_atomically(LOCAL, os.path.join(state_dir, MARKER), orjson.dumps(description))
        crashpoints.reached("state-committed")
        self._finish(state_dir)

    def _finish(self, state_dir: str) -> None:
        folders = {state_dir}
        for step in self.steps:
            if not step.done(state_dir):
                step.do(state_dir)
            folders.add(os.path.dirname(os.path.join(state_dir, step.dst)))
            crashpoints.reached("state-step")
        for folder in sorted(folders):
            LOCAL.fsync_dir(folder)
        os.unlink(os.path.join(state_dir, MARKER))
        LOCAL.fsync_dir(state_dir)
        _remove_aside(state_dir)
        crashpoints.reached("state-finished")

    def view(self, state_dir: str, name: str) -> str | None:
        """Where the content that file ``name`` has once this change is finished is now
        (``None``: it will not exist): for reading the state as the change leaves it without
        finishing it."""
        where: dict[str, str | None] = {}
        for step in self.steps:
            if step.done(state_dir):
                continue
            where[step.dst] = where.get(step.src, os.path.join(state_dir, step.src))
            if step.op == "rename":
                where[step.src] = None
        return where.get(name, os.path.join(state_dir, name))


def _remove_aside(state_dir: str) -> None:
    """Remove what a change killed before its commit left aside."""
    with os.scandir(state_dir) as entries:
        for entry in entries:
            if entry.name.startswith(ASIDE):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def pending(state_dir: str) -> Change | None:
    """The committed change not yet finished in ``state_dir``, if any. Raises
    :class:`StateError` if its marker is damaged, or written by a newer tfrecordd."""
    path = os.path.join(state_dir, MARKER)
    try:
        data = read_nofollow(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(path, f"cannot be read: {e.strerror or e}", damage_advice(path)) from e
    try:
        raw = orjson.loads(data)
        version = raw["version"]
        if isinstance(version, int) and version > STATE_FORMAT:
            raise newer_format_error(path, version)
        command = [str(arg) for arg in raw["command"]]
        steps = [_step(op, src, dst) for op, src, dst in raw["steps"]]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise StateError(path, f"is damaged ({e})", damage_advice(path)) from e
    return Change(command, steps)


def _step(op: str, src: str, dst: str) -> Step:
    if op not in ("write", "rename", "link"):
        raise ValueError(f"unknown step {op!r}")
    for path in (src, dst):
        if not isinstance(path, str) or os.path.isabs(path) or ".." in path.split("/"):
            raise ValueError(f"a path outside state_dir: {path!r}")
    return Step(cast(Op, op), src, dst)


def finish(state_dir: str) -> Change | None:
    """Finish the change committed in ``state_dir`` but interrupted, if any, and return it.
    Changes nothing if there is none (but for files a change left aside before its commit)."""
    if not os.path.isdir(state_dir):
        return None
    change = pending(state_dir)
    if change is None:
        _remove_aside(state_dir)
        return None
    change._finish(state_dir)
    return change
