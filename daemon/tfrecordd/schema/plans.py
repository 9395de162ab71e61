"""The compiled JSON → ``Example`` plan of a schema: C where the extension is built.

A typed facade over ``tfrecordd._cexample``: callers get a :class:`JsonPlan` or ``None`` (then the
schema's Python path does the work, byte for byte the same) and never load the extension
themselves, so mypy checks the calls against its stub.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from tfrecordd import speedups
from tfrecordd.schema.example import ExampleSchema

if TYPE_CHECKING:
    from tfrecordd._cexample import ExamplePlan

__all__ = ["JsonPlan", "StringGroups", "compile_json_plan", "string_groups"]


class JsonPlan(Protocol):
    """A compiled encoder of JSON payloads for one :class:`ExampleSchema`."""

    def encode_batch(self, payloads: Sequence[bytes], /) -> list[bytes | None]:
        """For each payload, its serialized ``Example``, or ``None``: not certain, encode that
        one with :meth:`ExampleSchema.encode_json` (which then writes the same record or
        reports the failure). Raises ``MemoryError`` if it cannot allocate."""
        ...


def compile_json_plan(schema: ExampleSchema) -> JsonPlan | None:
    """The compiled JSON path for ``schema``, or ``None``: the extension is not built, or
    ``TFRECORDD_PURE_PYTHON`` turned it off (:mod:`tfrecordd.speedups`), or some feature needs
    Python (:meth:`ExampleSchema.compiled_json_features`)."""
    module = speedups.load("_cexample")
    if module is None:
        return None
    features = schema.compiled_json_features()
    if features is None:
        return None
    plan_class: type[ExamplePlan] = module.ExamplePlan
    return plan_class(features)


class StringGroups(NamedTuple):
    """Payloads grouped by the string at one top-level key (:func:`string_groups`): indexes in
    order in each group."""

    by_value: list[list[int]]
    """For each value asked about, the payloads holding it."""
    other: list[int]
    """Payloads holding another string there."""
    unread: list[int]
    """Payloads the compiled reader is not sure of (not a JSON object it validates, the key
    missing or repeated, a value that is no string or holds escapes): read them in Python."""


def string_groups(
    payloads: Sequence[bytes | None], key: str, values: Sequence[str], *, lax: bool = False
) -> StringGroups | None:
    """JSON payloads grouped by the string at their top-level ``key``, one pass in C; ``None``
    where the extension is not built (or is turned off): then read every payload in Python.
    A payload given as ``None`` is left to Python (:attr:`StringGroups.unread`). With ``lax``,
    the rest of each payload is skipped without being checked: a payload that is not JSON may
    be grouped by the value it seems to hold (its reader must check it), where it is otherwise
    left to Python; a valid one is grouped alike either way."""
    module = speedups.load("_cexample")
    if module is None:
        return None
    try:
        raw_key, raw_values = key.encode(), [v.encode() for v in values]
    except UnicodeEncodeError:
        return None
    groups: list[list[int]] = module.string_groups(payloads, raw_key, raw_values, lax)
    return StringGroups(groups[:-2], groups[-2], groups[-1])
