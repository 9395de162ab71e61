"""Where a feature's value sits in an event: dotted keys with list indices."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tfrecordd.errors import EncodeError
from tfrecordd.format.wire import describe

__all__ = ["PathStep", "getter", "parse_path"]

_SEGMENT = re.compile(r"([^.\[\]]*)((?:\[-?\d+\])*)", re.ASCII)
_INDEX = re.compile(r"\[(-?\d+)\]", re.ASCII)

PathStep = tuple[str | None, int | None]
"""One step of a path: a key of an object, an index into a list, or (for ``a.0``) either."""


def parse_path(path: str) -> tuple[PathStep, ...]:
    """Split ``"user.age"``, ``"items.0.id"`` or ``"items[0].id"`` into steps.

    A dotted segment of digits is a key on an object and an index on a list; a bracketed index is
    only an index (and may be negative, counting from the end).
    """
    steps: list[PathStep] = []
    for segment in path.split("."):
        match = _SEGMENT.fullmatch(segment)
        if match is None or not (match.group(1) or match.group(2)):
            raise ValueError(f"invalid path {path!r}: bad segment {segment!r}")
        key, indices = match.group(1), match.group(2)
        if key:
            steps.append((key, int(key) if key.isdigit() and key.isascii() else None))
        steps.extend((None, int(i)) for i in _INDEX.findall(indices))
    return tuple(steps)


def getter(path: tuple[PathStep, ...], text: str) -> Callable[[Any], Any]:
    """A function from an event (or a step object) to the raw value at ``path``, or ``None``."""

    def get(event: Any) -> Any:
        current = event
        for depth, (key, index) in enumerate(path):
            if current is None:
                return None
            if current.__class__ is dict or isinstance(current, Mapping):
                if key is None:
                    where = _where(path, depth)
                    raise EncodeError(f"path {text!r}: {where} is an object, not a list")
                current = current.get(key)
            elif isinstance(current, list):
                if index is None:
                    where = _where(path, depth)
                    raise EncodeError(f"path {text!r}: {where} is a list, not an object")
                current = current[index] if -len(current) <= index < len(current) else None
            else:
                where = _where(path, depth)
                raise EncodeError(f"path {text!r}: {where} is {describe(current)}, not a container")
        return current

    return get


def _where(path: tuple[PathStep, ...], depth: int) -> str:
    if depth == 0:
        return "the event"
    parts = [f"[{i}]" if k is None else f".{k}" for k, i in path[:depth]]
    return repr("".join(parts).lstrip("."))
