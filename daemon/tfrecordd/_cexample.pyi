"""JSON payloads to serialized ``tf.train.Example`` records, for schemas of plain features;
chosen features' first values read back from serialized Examples; JSON payloads grouped by one
top-level string (a route's field), serialized Examples by the UTC hour of an int64 time (a
partition's)."""

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

    def encode_routed(
        self,
        payloads: Sequence[bytes],
        key: bytes,
        values: tuple[bytes, ...],
        time_feature: bytes | None,
        /,
    ) -> tuple[list[tuple[list[int], list[bytes], bytes | None]], list[int]]:
        """:meth:`encode_batch`, with the records grouped by the string at the top-level ``key``
        of each payload, noted as it is parsed: one group for each of ``values`` (at most 250),
        then one for another string or none, each ``(indexes, records, times)`` in order; and
        the indexes of the payloads left to Python: those :meth:`encode_batch` gives ``None``,
        and those whose value is no string, holds escapes or whose key is repeated. ``times``:
        with an ``int64`` feature ``time_feature`` (its name, UTF-8), the first value of that
        feature in each record as native ``int64``s, the lowest ``int64`` where the record holds
        none (empty, or a default written for it); else ``None``."""

def first_values(
    records: Sequence[bytes], names: Sequence[bytes], /
) -> list[tuple[int | float | bytes | None, ...] | None]:
    """For each record, the first value of each feature of ``names`` (``None`` where absent or
    empty), or ``None`` for a record that is not well-formed: what
    :class:`tfrecordd.format.features.FeatureReader` reads. Raises ``TypeError`` for a record
    or a name that is not ``bytes``."""

def string_groups(
    payloads: Sequence[bytes | None], key: bytes, values: Sequence[bytes], lax: bool = False, /
) -> list[list[int]]:
    """The indexes of ``payloads`` grouped by the string at the top-level ``key`` (UTF-8) of
    the JSON object each holds: one list for each of ``values`` (the first of a value given
    twice), then one for another string, then one for the payloads Python must read: not a JSON
    object this parser validates (the one the compiled plan uses), the key missing or repeated,
    its value no string or one holding escapes, or the payload no ``bytes``. With ``lax``, the
    rest of each payload is skipped, not validated (a payload that is not JSON may then be
    grouped by the value it seems to hold). Indexes are in order in each list. The parsing runs
    with the GIL released. Raises ``TypeError`` for a key or a value that is not ``bytes``."""

def time_groups(
    records: Sequence[bytes], name: bytes, per_second: int, known: bytes | None = None, /
) -> tuple[list[tuple[int, list[int], int, int]], list[int]]:
    """Serialized Examples grouped by the UTC hour (``value // per_second // 3600``, floored) of
    the first value of their ``int64`` feature ``name``, as
    :class:`tfrecordd.format.features.FeatureReader` reads it: ``(hour, indexes, lowest value,
    highest value)`` per hour in order of first appearance, and the indexes of the records
    whose first value is no ``int64`` (missing, empty, of another kind, or the record not
    well-formed). ``known``: each record's value where it is known already (native ``int64``s,
    one per record; the lowest ``int64`` where the record must be read), as
    :meth:`ExamplePlan.encode_routed` notes them. Raises ``TypeError`` for a record or a name
    that is not ``bytes``, and ``ValueError`` unless ``per_second`` is positive or for a
    ``known`` of another length."""
