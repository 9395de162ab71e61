""" "Did you mean" for a config's mistyped key or choice: the closest valid one, if one is close."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

CUTOFF = 0.6
"""How alike a word must be to a valid one to be proposed (difflib's ratio)."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the candidate closest to ``word``, or ``""`` if none is
    close enough."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CUTOFF)
    return f" (did you mean {close[0]!r}?)" if close else ""


def choices(expected: str) -> list[str]:
    """The quoted choices of a pydantic ``expected`` text (``"'none', 'gzip' or 'zstd'"``)."""
    return re.findall(r"'([^']*)'", expected)


def _models(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models(arg)]


def _is_container(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_is_container(a) for a in typing.get_args(tp))
    return origin in (dict, list, tuple)


def known_keys(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """The keys valid at ``loc`` (a pydantic error's location, without its last part) in a
    document that ``model`` validates: ``[]`` if the location cannot be followed."""
    current: type[BaseModel] | None = model
    pending_container = False
    for part in loc:
        if current is None:
            return []
        if pending_container:
            pending_container = False  # a dict key or list index: the same model below
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        inner = _models(field.annotation)
        current = inner[0] if len(inner) == 1 else None
        pending_container = _is_container(field.annotation)
    return list(current.model_fields) if current is not None and not pending_container else []
