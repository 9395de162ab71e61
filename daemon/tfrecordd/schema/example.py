"""``tf.train.Example`` schemas: :class:`ExampleSchema`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfrecordd.errors import EncodeError
from tfrecordd.format.wire import ExampleWriter, map_entries
from tfrecordd.schema.csv_values import compile_csv_feature
from tfrecordd.schema.json_values import (
    FeaturePlan,
    NeedsText,
    compile_feature,
    exact_event,
    load_event,
    not_an_object,
)
from tfrecordd.schema.specs import FeatureSpec, parse_features

__all__ = ["CompiledFeature", "ExampleSchema"]

CompiledFeature = tuple[bytes, bytes, str, bool, bytes | None]
"""One feature as :meth:`ExampleSchema.compiled_json_features` describes it to compiled code:
(name, JSON key, type, required, default entry)."""


class ExampleSchema:
    """Features of a ``tf.train.Example``, compiled once; :meth:`encode` turns events into bytes.

    ``features`` maps each feature name to its :class:`FeatureSpec` (or the short or long config
    form of one). Invalid specs raise :class:`~tfrecordd.errors.ConfigError` listing them all.
    """

    def __init__(self, features: Mapping[str, FeatureSpec | str | Mapping[str, Any]]) -> None:
        self.features: dict[str, FeatureSpec] = parse_features(features, "features")
        """The features as declared, in declaration order."""
        self._writer = ExampleWriter([(name, spec.type) for name, spec in self.features.items()])
        self._plan = tuple(compile_feature(name, spec) for name, spec in self.features.items())
        self._json_plan = tuple(
            compile_feature(name, spec, True) for name, spec in self.features.items()
        )
        self._csv_plan = tuple(
            compile_csv_feature(name, spec) for name, spec in self.features.items()
        )

    def encode(self, event: Any) -> bytes:
        """Serialize the ``Example`` for one decoded JSON object.

        A float for an int64 feature is taken at its exact binary value (``3.0`` is 3); the
        number a JSON text holds is read exactly by :meth:`encode_json`. Raises
        :class:`~tfrecordd.errors.EncodeError` naming the feature at fault (``None`` when the
        event is not an object).
        """
        return self._encode(event, self._plan)

    def encode_json(self, payload: bytes, parsed: Any = None) -> bytes:
        """Serialize the ``Example`` for one JSON text, every number taken exactly as written.

        ``parsed`` is ``orjson.loads(payload)`` when the caller has it (a source may have added
        keys to it), else the payload is parsed here. Where a float (a number with a fraction
        or an exponent, or an integer beyond 64 bits, which orjson reads as a float) meets an
        int64 feature, or a float of
        seconds meets a timestamp whose count its digits could change, the payload is read
        again keeping each number's text: ``1.0`` is 1 and ``9007199254740993.0`` is
        9007199254740993, ``1.0000000000000001`` is refused, and ``1700000000.123456789``
        seconds is exact to the nanosecond. A ``parsed`` value whose payload is not JSON text
        is taken as :meth:`encode` takes it. A number beyond a double's range (``1e400``),
        which JSON allows and orjson refuses, is ignored where no feature reads it and refused as
        out of range where one does. Raises ``orjson.JSONDecodeError`` for a payload that is not
        JSON, else as :meth:`encode`.
        """
        event, wide = (parsed, False) if parsed is not None else load_event(payload)
        if wide:
            return self._encode(event, self._plan)
        try:
            return self._encode(event, self._json_plan)
        except NeedsText:
            return self._encode(exact_event(payload, event), self._plan)

    def _encode(self, event: Any, plan: tuple[FeaturePlan, ...]) -> bytes:
        if event.__class__ is not dict and not isinstance(event, Mapping):
            raise not_an_object(event)
        values: list[list[Any] | None] = []
        name = None
        try:
            for name, key, get, convert, default, required, plain in plan:  # noqa: B007
                raw = event.get(key) if key is not None else get(event)
                if raw.__class__ in plain:
                    values.append([raw])
                elif raw is None:
                    if required:
                        raise EncodeError("missing required feature")
                    values.append(default)
                else:
                    values.append(convert(raw))
        except EncodeError as e:
            raise EncodeError(e.reason, name) from None
        return self._writer.encode(values)

    def compiled_json_features(self) -> tuple[CompiledFeature, ...] | None:
        """What a compiled JSON encoder needs to write exactly what :meth:`encode` writes, or
        ``None`` when some feature needs Python to convert its value.

        Eligible: every feature reads a top-level key (its name, or a ``path`` of one key) that
        no other feature reads, and has no ``shape`` or ``length``. Each feature is
        ``(name, JSON key, type, required, default entry)``: name and key as UTF-8, the type's
        name (``int64/<unit>`` for a ``time_unit``: the compiled plan writes whole seconds given
        as integers and leaves every other timestamp to Python), and the serialized map field
        that :meth:`encode` writes for a missing value, or ``None`` when it leaves the feature
        out.
        """
        out: list[CompiledFeature] = []
        keys: set[str] = set()
        for (name, key, _, _, default, required, _), spec in zip(
            self._plan, self.features.values(), strict=True
        ):
            special = spec.shape is not None or spec.length
            if key is None or special or key in keys:
                return None
            keys.add(key)
            try:
                name_bytes, key_bytes = name.encode(), key.encode()
            except UnicodeEncodeError:
                return None
            entry = None
            if default is not None:
                # Encoded alone, the Example holds exactly this feature's map entry.
                entry = map_entries(ExampleWriter([(name, spec.type)]).encode([default]))
            kind = spec.type.value if spec.time_unit is None else f"int64/{spec.time_unit}"
            out.append((name_bytes, key_bytes, kind, required, entry))
        return tuple(out)

    def encode_csv(self, row: Mapping[str, Any]) -> bytes:
        """Serialize the ``Example`` for one CSV row: header name → field text.

        Each feature's ``path`` is a header name (default: the feature's name); the text is
        converted as :mod:`tfrecordd.schema.csv_values` says. Raises
        :class:`~tfrecordd.errors.EncodeError` naming the feature at fault.
        """
        if not isinstance(row, Mapping):
            raise not_an_object(row)
        values: list[list[Any] | None] = []
        name = None
        try:
            for name, header, convert, default, required in self._csv_plan:  # noqa: B007
                text = row.get(header)
                if text is None or text == "":
                    if required:
                        raise EncodeError(f"missing required feature (column {header!r})")
                    values.append(default)
                else:
                    values.append(convert(text))
        except EncodeError as e:
            raise EncodeError(e.reason, name) from None
        return self._writer.encode(values)
