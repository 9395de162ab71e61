"""Decoded JSON values to the wire writer's values, one converter per feature compiled once."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from tfrecordd.errors import EncodeError
from tfrecordd.format.wire import INT64_MAX, INT64_MIN, FeatureType, clipped, describe
from tfrecordd.schema.numtext import (
    PER_SECOND,
    SCALE,
    clip_text,
    decimal_int,
    floor_of_any_text,
    parse_rfc3339,
    timestamp_int,
)
from tfrecordd.schema.paths import getter, parse_path

if TYPE_CHECKING:
    from tfrecordd.schema.specs import FeatureSpec, TimeUnit

__all__ = [
    "FeaturePlan",
    "NeedsText",
    "compile_feature",
    "default_values",
    "exact_event",
    "load_event",
    "not_an_object",
    "wide_event",
]


class _TextFloat(float):
    """A JSON number with a fraction or an exponent, with the text it was read from: an int64
    feature takes the number the text says, not the float it rounds to."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> _TextFloat:
        self = super().__new__(cls, text)
        self.text = text
        return self


class _WideNumber(str):
    """A JSON number beyond a double's range (``1e400``, an integer of 310 digits), as its text:
    JSON allows it, orjson refuses it, and no feature type can hold it."""

    __slots__ = ()


def _out_of_range(kind: str, x: _WideNumber) -> EncodeError:
    """The refusal of a number beyond a double's range, worded as the writer words its own."""
    where = "float out of float32 range" if kind == "float" else f"{kind} out of range"
    return EncodeError(f"{where}: {clip_text(x)}")


class NeedsText(Exception):
    """A float reached an int64 feature in an event parsed by orjson, which keeps no text: the
    event is read again from its text (:func:`exact_event`) to know the number exactly."""


def _int64_element(x: Any) -> int:
    cls = x.__class__
    if cls is int:
        return int(x)
    if cls is _TextFloat:
        value = decimal_int(x.text, 0, False)
        if value is None:
            raise EncodeError(f"expected int64, got float {clip_text(x.text)}")
        return value
    if cls is float and x.is_integer():
        return int(x)
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    if isinstance(x, int) and cls is not bool:
        return int(x)
    if cls is _WideNumber:
        raise _out_of_range("int64", x)
    raise EncodeError(f"expected int64, got {describe(x)}")


def _int64_json_element(x: Any) -> int:
    if x.__class__ is float:
        # The double does not say what was written: 1.0000000000000001 parses to 1.0. The
        # text decides, as it does in the compiled path.
        raise NeedsText
    return _int64_element(x)


def _float_element(x: Any) -> float | int:
    cls = x.__class__
    if cls is float or cls is int:
        return x  # type: ignore[no-any-return]
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    if isinstance(x, int | float) and cls is not bool:
        return float(x)
    if cls is _WideNumber:
        raise _out_of_range("float", x)
    raise EncodeError(f"expected float, got {describe(x)}")


def _bytes_element(x: Any) -> str | bytes:
    cls = x.__class__
    if cls is str or cls is bytes:
        return x  # type: ignore[no-any-return]
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    if cls is _WideNumber:
        raise EncodeError(f"expected bytes, got number {clip_text(x)}")
    raise EncodeError(f"expected bytes, got {describe(x)}")


def _timestamp_element(unit: TimeUnit, from_json: bool) -> Callable[[Any], int]:
    per_second = PER_SECOND[unit]
    digits_scale = SCALE[unit]

    def convert(x: Any) -> int:
        cls = x.__class__
        if cls is int:
            return int(x) * per_second
        if cls is _TextFloat:
            return timestamp_int(x.text, digits_scale)
        if cls is float and math.isfinite(x):
            if from_json:
                value = floor_of_any_text(x, digits_scale)
                if value is None:
                    raise NeedsText
                if not INT64_MIN <= value <= INT64_MAX:
                    raise EncodeError(f"int64 out of range: {clipped(x)}")
                return value
            # A float given as a value: its shortest repr, as binary float math would turn
            # 0.7 s into 699 ms.
            return timestamp_int(repr(x), digits_scale)
        if cls is str:
            return parse_rfc3339(x, per_second)
        if cls is _WideNumber:
            raise _out_of_range("int64", x)
        if cls is list:
            raise EncodeError("nested list: declare a shape")
        raise EncodeError(f"expected a timestamp, got {describe(x)}")

    return convert


def _element_converter(spec: FeatureSpec, from_json: bool = False) -> Callable[[Any], Any]:
    """The converter of one value; ``from_json``: for values parsed by orjson, where a float
    for an int64 feature raises :class:`NeedsText`."""
    if spec.time_unit is not None:
        return _timestamp_element(spec.time_unit, from_json)
    if spec.type is FeatureType.INT64 and from_json:
        return _int64_json_element
    return {
        FeatureType.INT64: _int64_element,
        FeatureType.FLOAT: _float_element,
        FeatureType.BYTES: _bytes_element,
    }[spec.type]


_PLAIN_TYPES: dict[FeatureType, frozenset[type]] = {
    FeatureType.INT64: frozenset({int}),
    FeatureType.FLOAT: frozenset({int, float}),
    FeatureType.BYTES: frozenset({str, bytes}),
}
"""Element types that pass through unchanged: the writer checks ranges itself."""


def _shape_of(value: Any) -> list[int]:
    dims = []
    while isinstance(value, list):
        dims.append(len(value))
        value = value[0] if value else None
    return dims


def _flatten(value: Any, shape: list[int]) -> list[Any]:
    out: list[Any] = []
    rank = len(shape)

    def fits() -> bool:
        # A stack, not recursion: a shape may have more dimensions than Python recurses.
        stack = [(value, 0)]
        while stack:
            x, depth = stack.pop()
            if depth == rank:
                if isinstance(x, list):
                    return False
                out.append(x)
            elif not isinstance(x, list) or len(x) != shape[depth]:
                return False
            else:
                stack.extend((e, depth + 1) for e in reversed(x))
        return True

    if not fits():
        got = _shape_of(value)
        detail = (
            "a scalar" if not got else f"{clipped(got)} (ragged)" if got == shape else clipped(got)
        )
        raise EncodeError(f"shape mismatch: expected {clipped(shape)}, got {detail}")
    return out


def _value_converter(spec: FeatureSpec, from_json: bool = False) -> Callable[[Any], list[Any]]:
    """A function from a present (not ``None``) raw value to the writer's list of values."""
    element = _element_converter(spec, from_json)
    plain = _PLAIN_TYPES[spec.type] if spec.time_unit is None else frozenset()
    shape = spec.shape

    if spec.length:

        def count(raw: Any) -> list[Any]:
            if not isinstance(raw, list):
                raise EncodeError(f"expected a list to count, got {describe(raw)}")
            return [len(raw)]

        return count

    if shape is not None:

        def shaped(raw: Any) -> list[Any]:
            return [element(x) for x in _flatten(raw, shape)]

        return shaped

    def convert(raw: Any) -> list[Any]:
        cls = raw.__class__
        if cls in plain:
            return [raw]
        if cls is list:
            if plain.issuperset(map(type, raw)):
                return raw  # type: ignore[no-any-return]
            return [element(x) for x in raw]
        return [element(raw)]

    return convert


def default_values(spec: FeatureSpec) -> list[Any]:
    """``spec.default`` as the writer's values: a ``length`` feature's default is the count
    itself."""
    convert = _value_converter(spec.model_copy(update={"length": False}) if spec.length else spec)
    return convert(spec.default)


FeaturePlan = tuple[
    str, str | None, Callable[[Any], Any], Callable[[Any], list[Any]], Any, bool, frozenset[type]
]
"""(name, top-level key or None, getter, converter, default values or None, required, the types
of a scalar that is written as is)."""


def compile_feature(name: str, spec: FeatureSpec, from_json: bool = False) -> FeaturePlan:
    """The plan of one feature; ``from_json``: for events parsed by orjson (a float for an int64
    feature raises :class:`NeedsText`)."""
    text = spec.path if spec.path is not None else name
    path = parse_path(spec.path) if spec.path is not None else ((name, None),)
    key = path[0][0] if len(path) == 1 and path[0][1] is None else None
    convert = _value_converter(spec, from_json)
    default = None
    if spec.default is not None:
        default = default_values(spec)
    special = spec.shape is not None or spec.time_unit is not None or spec.length
    plain = frozenset() if special else _PLAIN_TYPES[spec.type]
    return name, key, getter(path, text), convert, default, spec.required, plain


_EXACT_JSON = json.JSONDecoder(parse_float=_TextFloat)


def exact_event(payload: bytes, parsed: Any) -> Any:
    """``payload`` parsed again, each number with a fraction or an exponent as a
    :class:`_TextFloat` and every integer exact; the keys a source added to ``parsed`` (an object
    it parsed from ``payload``) are kept. ``parsed`` itself when the payload is not JSON text
    (a source's own structured value)."""
    try:
        event = _EXACT_JSON.decode(payload.decode())
    except RecursionError:
        raise EncodeError(
            "nested too deeply to read its numbers exactly (a float for an int64 feature)"
        ) from None
    except ValueError:
        if parsed is not None:
            return parsed
        raise EncodeError("not JSON text: its numbers cannot be read exactly") from None
    if isinstance(parsed, dict) and isinstance(event, dict):
        for key, value in parsed.items():
            event.setdefault(key, value)
    return event


def _wide_int(text: str) -> int | _WideNumber:
    # Past 330 digits no int is a finite double: not worth int() (which refuses 4301 digits).
    if len(text) > 330:
        return _WideNumber(text)
    value = int(text)
    try:
        float(value)
    except OverflowError:
        return _WideNumber(text)
    return value


def _wide_float(text: str) -> _TextFloat | _WideNumber:
    value = _TextFloat(text)
    return _WideNumber(text) if math.isinf(value) else value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


_WIDE_JSON = json.JSONDecoder(
    parse_float=_wide_float, parse_int=_wide_int, parse_constant=_no_constant
)


def load_event(payload: bytes) -> tuple[Any, bool]:
    """``payload`` parsed by orjson, or, where orjson refuses a number JSON allows (``1e400``),
    by :func:`wide_event`; and whether it took that second reading (its numbers are then kept
    as text: encode it by the plan that reads them so). Raises ``orjson.JSONDecodeError`` for a
    payload that is not JSON."""
    try:
        return orjson.loads(payload), False
    except orjson.JSONDecodeError as e:
        # Only what orjson refuses is read again: the fast path stays as it was.
        return wide_event(payload, e), True


def wide_event(payload: bytes, refusal: orjson.JSONDecodeError) -> Any:
    """``payload``, which orjson refused with ``refusal``, read as JSON allows it: a number
    beyond a double's range (which orjson refuses wherever it is) is kept as its text, and the
    event encodes if no feature reads it; one that does is refused as out of range. Numbers
    are read as :func:`exact_event` reads them. Raises ``orjson.JSONDecodeError`` for a payload
    that is not JSON for another reason (``NaN``, a lone surrogate, a syntax error)."""
    # orjson stops at the first number out of range: what is wrong after it is told here.
    wide_first = "infinity" in str(refusal)
    try:
        text = payload.decode("utf-8")
        event = _WIDE_JSON.decode(text)
    except json.JSONDecodeError as e:
        raise (orjson.JSONDecodeError(e.msg, e.doc, e.pos) if wide_first else refusal) from None
    except (ValueError, RecursionError):
        raise refusal from None
    wide = False
    stack = [event]
    while stack:  # a stack, not recursion: JSON nests deeper than Python recurses
        x = stack.pop()
        cls = x.__class__
        if cls is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
        elif cls is list:
            stack.extend(x)
        elif cls is _WideNumber:
            wide = True
        elif cls is str and not x.isascii():
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                if not wide_first:
                    raise refusal from None
                reason = "a string holds an escaped lone surrogate (not Unicode text)"
                raise orjson.JSONDecodeError(reason, text, 0) from None
    if not wide:
        raise refusal
    return event


def not_an_object(event: Any) -> EncodeError:
    """The refusal of an event that is not a JSON object."""
    return EncodeError(f"not an object: got {describe(event)}")
