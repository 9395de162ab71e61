"""The compiled JSON → ``Example`` plan of a schema: C where the extension is built.

A typed facade over ``tfrecordd._cexample``: callers get a :class:`JsonPlan` or ``None`` (then the
schema's Python path does the work, byte for byte the same) and never load the extension
themselves, so mypy checks the calls against its stub.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from tfrecordd import speedups
from tfrecordd.schema.example import ExampleSchema

if TYPE_CHECKING:
    from tfrecordd._cexample import ExamplePlan

__all__ = ["JsonPlan", "compile_json_plan", "string_values"]


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


def string_values(payloads: Sequence[bytes], key: str) -> list[str | None]:
    """For each JSON payload, the string at its top-level ``key`` where the compiled reader is
    sure of it, else ``None`` (no extension, not a JSON object it validates, the key missing or
    repeated, another kind of value): the caller reads those payloads in Python."""
    module = speedups.load("_cexample")
    if module is None:
        return [None] * len(payloads)
    try:
        raw_key = key.encode()
    except UnicodeEncodeError:
        return [None] * len(payloads)
    values: list[str | None] = module.string_values(payloads, raw_key)
    return values
