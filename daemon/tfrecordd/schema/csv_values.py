"""CSV field text to the wire writer's values.

CSV rows (:meth:`~tfrecordd.schema.ExampleSchema.encode_csv`) are text: a feature's ``path`` is
a header name, and each field is converted by the feature's type:

- An empty field, or a column the row lacks, is a missing value (default, required, or left out).
- ``int64`` takes an optional sign and ASCII digits (``"42"``, ``"-7"``); ``"4.5"``, ``"3.0"``,
  ``"1e3"`` and anything outside the int64 range are refused. With ``time_unit``, a number of
  seconds (``"1.5"``) or an RFC 3339 timestamp.
- ``float`` takes decimal and exponent notation, ``nan`` and ``inf`` (any case); a value that does
  not fit a float32 is refused, never rounded to infinity.
- ``bytes`` takes the text as it is, written as UTF-8.
- Surrounding spaces are ignored for numbers, kept for bytes.
- A field is one value, unless the feature declares a ``separator``: then it is split on it, and
  each piece is one value (an empty piece is refused for numbers, an empty string for bytes).
  ``shape`` then checks the number of values; ``length`` counts them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from tfrecordd.errors import EncodeError
from tfrecordd.format.wire import INT64_MAX, INT64_MIN, FeatureType, clipped, describe
from tfrecordd.schema.json_values import default_values
from tfrecordd.schema.numtext import PER_SECOND, SCALE, parse_rfc3339, timestamp_int
from tfrecordd.schema.specs import FeatureSpec, TimeUnit

__all__ = ["CsvFeaturePlan", "compile_csv_feature"]

_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
_FLOAT_WORDS = frozenset(
    sign + word for sign in ("", "+", "-") for word in ("nan", "inf", "infinity")
)


def _csv_int64(text: str) -> int:
    if _INT_TEXT.fullmatch(text) is None:
        raise EncodeError(f"expected int64, got text {clipped(text)}")
    try:
        value = int(text)
    except ValueError:  # more digits than int() parses: far outside the range anyway
        value = INT64_MAX + 1
    if not INT64_MIN <= value <= INT64_MAX:
        raise EncodeError(f"int64 out of range: {clipped(text.strip())}")
    return value


def _csv_float(text: str) -> float:
    if _DECIMAL_TEXT.fullmatch(text) is None:
        if text.strip().lower() not in _FLOAT_WORDS:
            raise EncodeError(f"expected float, got text {clipped(text)}")
        return float(text)
    value = float(text)
    if math.isinf(value):
        raise EncodeError(f"float out of float32 range: {clipped(text.strip())}")
    return value


def _csv_bytes(text: str) -> str:
    return text


def _csv_timestamp(unit: TimeUnit) -> Callable[[str], int]:
    per_second = PER_SECOND[unit]
    digits_scale = SCALE[unit]

    def convert(text: str) -> int:
        t = text.strip()
        if _DECIMAL_TEXT.fullmatch(t) is not None:
            return timestamp_int(t, digits_scale)
        return parse_rfc3339(t, per_second)

    return convert


def _csv_converter(spec: FeatureSpec) -> Callable[[Any], list[Any]]:
    """A function from a CSV field's non-empty text to the writer's list of values."""
    element: Callable[[str], Any]
    if spec.time_unit is not None:
        element = _csv_timestamp(spec.time_unit)
    else:
        element = {
            FeatureType.INT64: _csv_int64,
            FeatureType.FLOAT: _csv_float,
            FeatureType.BYTES: _csv_bytes,
        }[spec.type]
    sep = spec.separator
    shape = spec.shape
    count = math.prod(shape) if shape is not None else None
    length = spec.length

    def convert(text: Any) -> list[Any]:
        if text.__class__ is not str:
            raise EncodeError(f"expected text, got {describe(text)}")
        if sep is None:
            if length:
                return [1]
            values = [element(text)]
        else:
            pieces = text.split(sep)
            if length:
                return [len(pieces)]
            values = []
            try:
                for piece in pieces:
                    values.append(element(piece))
            except EncodeError as e:
                raise EncodeError(f"value {len(values)}: {e.reason}") from None
        if count is not None and len(values) != count:
            raise EncodeError(
                f"shape mismatch: shape {clipped(shape)} needs {clipped(count)} values, "
                f"got {len(values)}"
            )
        return values

    return convert


CsvFeaturePlan = tuple[str, str, Callable[[Any], list[Any]], Any, bool]
"""(name, header name, converter, default values or None, required)."""


def compile_csv_feature(name: str, spec: FeatureSpec) -> CsvFeaturePlan:
    """The plan of one feature read from a CSV row."""
    default = default_values(spec) if spec.default is not None else None
    header = spec.path if spec.path is not None else name
    return name, header, _csv_converter(spec), default, spec.required
