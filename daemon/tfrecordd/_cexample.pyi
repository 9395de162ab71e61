"""JSON payloads to serialized ``tf.train.Example`` records, for schemas of plain features;
chosen features' first values read back from serialized Examples; one top-level string of each
JSON object (a route's field)."""

from collections.abc import Sequence
from typing import final

@final
class ExamplePlan:
    """A compiled Example encoder, built once from
    :meth:`tfrecordd.schema.ExampleSchema.compiled_json_features`."""

    def __init__(self, features: Sequence[tuple[bytes, bytes, str, bool, bytes | None]]) -> None:
        """``features``: ``(name, JSON key, type, required, default entry)`` per feature. Name
        and JSON key are UTF-8; the type is ``"int64"``, ``"float"``, ``"bytes"``, or
        ``"int64/<unit>"`` for an int64 with a ``time_unit`` (``s``, ``ms``, ``us``, ``ns``:
        whole seconds written as an integer are multiplied, anything else is Python's); the default
        entry is the serialized map field written for a missing value, or ``None`` to leave the
        feature out. Raises ``ValueError`` on an unknown type, a name declared twice, or two
        features reading one JSON key; a plan is initialized once."""

    @property
    def features(self) -> tuple[tuple[bytes, bytes, str, bool, bytes | None], ...]:
        """The features as given to the constructor."""

    def encode_batch(self, payloads: Sequence[bytes], /) -> list[bytes | None]:
        """For each payload, its serialized ``Example``, or ``None``: not certain, encode that
        one the Python way (which then writes the same record or reports the failure).

        Payloads that are not ``bytes`` get ``None``. The parsing runs with the GIL released.
        """

def first_values(
    records: Sequence[bytes], names: Sequence[bytes], /
) -> list[tuple[int | float | bytes | None, ...] | None]:
    """For each record, the first value of each feature of ``names`` (``None`` where absent or
    empty), or ``None`` for a record that is not well-formed: what
    :class:`tfrecordd.format.features.FeatureReader` reads. Raises ``TypeError`` for a record
    or a name that is not ``bytes``."""

def string_values(payloads: Sequence[bytes], key: bytes, /) -> list[str | None]:
    """For each payload, the string at the top-level ``key`` (UTF-8) of the JSON object it
    holds, or ``None``: not a JSON object this parser validates (the one the compiled plan
    uses), the key missing or repeated, or its value no string; then the caller reads that
    payload in Python. The parsing runs with the GIL released. Raises ``TypeError`` for a key
    that is not ``bytes``; a payload that is not ``bytes`` gets ``None``."""
