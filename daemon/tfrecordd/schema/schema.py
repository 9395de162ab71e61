"""Declared schemas: decoded JSON events in, serialized Example / SequenceExample bytes out.

A schema names each feature, its type and where its value sits in the event. It is compiled once
into a plan of getters and converters feeding a :mod:`tfrecordd.format.wire` writer; an event that
does not fit raises :class:`~tfrecordd.errors.EncodeError` whose ``feature`` names the feature at
fault and whose ``reason`` names the problem.

Value rules, the same for every feature:

- A missing key, a path that leads nowhere, or JSON ``null`` is a missing value: the feature is
  filled from its ``default`` if it has one, refused if it is ``required``, else left out.
- A scalar is a list of one value; a list is taken as is. A nested list needs a declared
  ``shape`` and is flattened row-major.
- ``int64`` takes integers and integral floats (``3.0``, not ``3.5``); ``float`` takes integers
  and floats that fit a float32 (NaN and infinities pass, an overflow does not); ``bytes`` takes
  strings (written as UTF-8), and ``bytes`` objects from callers that are not JSON.
- From JSON text (:meth:`ExampleSchema.encode_json`), an int64 or a timestamp is the number the
  text says, exactly: ``1.0000000000000001`` is not an integer and ``-9223372036854775809`` is
  out of range, though a double would round the first to 1 and the second to ``-2**63``.
- Timestamp text is ASCII: an RFC 3339 timestamp written with other digits (full-width,
  Arabic-Indic) is refused, as Python's ``int()`` would read them.
- ``true`` / ``false`` are refused for ``int64`` and ``float``: a boolean where a number is
  declared is far more often a producer's bug than a wish for 1 and 0.

CSV rows (:meth:`ExampleSchema.encode_csv`) are text: a feature's ``path`` is a header name, and
each field is converted by the feature's type:

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

import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any, Literal

import orjson
import pydantic

from tfrecordd.errors import ConfigError, EncodeError
from tfrecordd.format.wire import (
    INT64_MAX,
    INT64_MIN,
    ExampleWriter,
    FeatureType,
    SequenceExampleWriter,
    clipped,
    describe,
    map_entries,
)

__all__ = [
    "ExampleSchema",
    "FeatureSpec",
    "SequenceSchema",
    "feature_description",
    "parse_feature",
    "parse_path",
    "render_feature_description",
]

TimeUnit = Literal["s", "ms", "us", "ns"]
_SCALE = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_PER_SECOND: dict[str, int] = {unit: 10**digits for unit, digits in _SCALE.items()}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
_FRACTION_DIGITS = 9
"""Digits of a fraction of a second that can change a count of the finest unit (ns): the rest
are floored away, so they are not read."""
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
_FLOAT_WORDS = frozenset(
    sign + word for sign in ("", "+", "-") for word in ("nan", "inf", "infinity")
)
_NUMBER_TEXT = re.compile(r"\s*([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?)([0-9]+))?\s*")
_SEGMENT = re.compile(r"([^.\[\]]*)((?:\[-?\d+\])*)", re.ASCII)
_INDEX = re.compile(r"\[(-?\d+)\]", re.ASCII)
_INT64_DIGITS = 19
"""Every integer of more digits is outside int64."""

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


class FeatureSpec(pydantic.BaseModel, extra="forbid", frozen=True):
    """How one feature is found in an event and checked.

    In a config file a feature is either the short form, its type name (``age = "int64"``), or a
    table of these fields (``age = {type = "int64", path = "user.age", required = true}``).
    """

    type: FeatureType
    """The value kind: ``int64``, ``float`` (written as float32) or ``bytes``."""
    path: str | None = None
    """Where the value sits in the event: dotted keys with list indices (``user.age``,
    ``items.0.id``, ``items[0].id``). Default: the feature's name as a top-level key. In a
    sequence schema with ``steps``, the path of a feature list is relative to each step."""
    required: bool = False
    """Refuse an event that lacks the value (or holds ``null``) instead of leaving it out."""
    default: Any = None
    """The value written when the event lacks one; checked against the type and shape at load
    time. Cannot be combined with ``required``. Bytes defaults are text."""
    shape: list[int] | None = None
    """A fixed shape: ``[]`` for exactly one value, ``[3]`` for a list of three, ``[2, 3]`` for two
    lists of three, flattened row-major. Without it, a nested list is refused."""
    time_unit: TimeUnit | None = None
    """For ``int64`` only: the value is an RFC 3339 timestamp string or a number of seconds since
    the epoch, written as an integer count of this unit since the epoch. Strings are converted
    with exact integer arithmetic; anything finer than the unit is floored (toward the past)."""
    length: bool = False
    """For ``int64`` only: write the number of elements of the list at ``path`` instead of the list
    itself (a sequence length, a count of items). A missing list is a missing value."""
    separator: str | None = None
    """CSV rows only: split the field on this string into a list of values (``";"`` makes
    ``"1;2;3"`` three values). Default: the field is a single value. JSON events carry lists as
    lists and ignore it."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"type": data}
        return data

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> FeatureSpec:
        if self.path is not None:
            parse_path(self.path)
        if self.type is not FeatureType.INT64:
            for option in ("time_unit", "length"):
                if getattr(self, option):
                    raise ValueError(f"{option} applies to int64 features only")
        if self.length and (self.shape is not None or self.time_unit is not None):
            raise ValueError("length cannot be combined with shape or time_unit")
        if self.separator == "":
            raise ValueError("separator must not be empty")
        if self.shape is not None and any(d < 1 for d in self.shape):
            raise ValueError(f"shape dimensions must be >= 1, got {self.shape}")
        if self.default is not None:
            if self.required:
                raise ValueError("a required feature cannot have a default")
            try:
                values = _default_converter(self)(self.default)
                ExampleWriter([("default", self.type)]).encode([values])
            except EncodeError as e:
                raise ValueError(f"invalid default: {e.reason}") from None
            if any(isinstance(v, bytes) for v in values):
                raise ValueError("invalid default: bytes defaults must be text")
        return self


def parse_feature(value: FeatureSpec | str | Mapping[str, Any]) -> FeatureSpec:
    """A :class:`FeatureSpec` from the short form (a type name) or the long form (a mapping)."""
    if isinstance(value, FeatureSpec):
        return value
    return FeatureSpec.model_validate(value)


class _TextFloat(float):
    """A JSON number with a fraction or an exponent, with the text it was read from: an int64
    feature takes the number the text says, not the float it rounds to."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> _TextFloat:
        self = super().__new__(cls, text)
        self.text = text
        return self


class _NeedsText(Exception):
    """A float reached an int64 feature in an event parsed by orjson, which keeps no text: the
    event is read again from its text (:func:`_exact_event`) to know the number exactly."""


def _clip_text(text: str) -> str:
    text = text.strip()
    return text if len(text) <= 40 else text[:37] + "..."


def _decimal_int(text: str, digits_scale: int, floor: bool) -> int | None:
    """The decimal number ``text`` times ``10**digits_scale`` as an int64, computed exactly; when
    it is not an integer, floored if ``floor``, else ``None``. Raises
    :class:`~tfrecordd.errors.EncodeError` outside int64.

    Works on the digits, so no exponent or length of text can build a huge number.
    """
    match = _NUMBER_TEXT.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise EncodeError(f"expected a number, got {clipped(text)}")
    sign, whole, fraction, exp_sign, exp = match.groups()
    fraction = fraction or ""
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return 0
    significant = digits.rstrip("0")
    exponent = 0
    if exp is not None:
        exp = exp.lstrip("0") or "0"
        exponent = int(exp) if len(exp) <= 18 else 10**18
        if exp_sign == "-":
            exponent = -exponent
    exponent += len(digits) - len(significant) - len(fraction) + digits_scale
    if len(significant) + exponent > _INT64_DIGITS:
        raise EncodeError(f"int64 out of range: {_clip_text(text)}")
    value: int
    if exponent >= 0:
        value, inexact = int(significant) * 10**exponent, False
    else:
        cut = len(significant) + exponent
        value, inexact = (int(significant[:cut]) if cut > 0 else 0), True
    if inexact and not floor:
        return None
    if sign == "-":
        value = -value - inexact
    if not INT64_MIN <= value <= INT64_MAX:
        raise EncodeError(f"int64 out of range: {_clip_text(text)}")
    return value


def _timestamp_int(text: str, digits_scale: int) -> int:
    """A number of seconds written as ``text``, in units of ``10**-digits_scale`` s, floored."""
    value = _decimal_int(text, digits_scale, True)
    assert value is not None
    return value


def _floor_of_any_text(x: float, digits_scale: int) -> int | None:
    """``floor(t * 10**digits_scale)``, the same for every decimal text ``t`` that parses to
    ``x``, or ``None`` when those texts disagree (then only the text can say).

    Every such ``t`` lies within half a ulp of ``x``: when both ends of that interval floor to
    one count of the unit, so does ``t``. Exact integer arithmetic on the binary values.
    """
    p, q = x.as_integer_ratio()
    up, uq = math.ulp(x).as_integer_ratio()
    scale = 10**digits_scale
    den = 2 * q * uq
    low = (2 * p * uq - up * q) * scale // den
    high = (2 * p * uq + up * q) * scale // den
    return low if low == high else None


def _int64_element(x: Any) -> int:
    cls = x.__class__
    if cls is int:
        return int(x)
    if cls is _TextFloat:
        value = _decimal_int(x.text, 0, False)
        if value is None:
            raise EncodeError(f"expected int64, got float {_clip_text(x.text)}")
        return value
    if cls is float and x.is_integer():
        return int(x)
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    if isinstance(x, int) and cls is not bool:
        return int(x)
    raise EncodeError(f"expected int64, got {describe(x)}")


def _int64_json_element(x: Any) -> int:
    if x.__class__ is float:
        # The double does not say what was written: 1.0000000000000001 parses to 1.0. The
        # text decides, as it does in the compiled path.
        raise _NeedsText
    return _int64_element(x)


def _float_element(x: Any) -> float | int:
    cls = x.__class__
    if cls is float or cls is int:
        return x  # type: ignore[no-any-return]
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    if isinstance(x, int | float) and cls is not bool:
        return float(x)
    raise EncodeError(f"expected float, got {describe(x)}")


def _bytes_element(x: Any) -> str | bytes:
    cls = x.__class__
    if cls is str or cls is bytes:
        return x  # type: ignore[no-any-return]
    if cls is list:
        raise EncodeError("nested list: declare a shape")
    raise EncodeError(f"expected bytes, got {describe(x)}")


def _timestamp_element(unit: TimeUnit, from_json: bool) -> Callable[[Any], int]:
    per_second = _PER_SECOND[unit]
    digits_scale = _SCALE[unit]

    def convert(x: Any) -> int:
        cls = x.__class__
        if cls is int:
            return int(x) * per_second
        if cls is _TextFloat:
            return _timestamp_int(x.text, digits_scale)
        if cls is float and math.isfinite(x):
            if from_json:
                value = _floor_of_any_text(x, digits_scale)
                if value is None:
                    raise _NeedsText
                if not INT64_MIN <= value <= INT64_MAX:
                    raise EncodeError(f"int64 out of range: {clipped(x)}")
                return value
            # A float given as a value: its shortest repr, as binary float math would turn
            # 0.7 s into 699 ms.
            return _timestamp_int(repr(x), digits_scale)
        if cls is str:
            return _parse_rfc3339(x, per_second)
        if cls is list:
            raise EncodeError("nested list: declare a shape")
        raise EncodeError(f"expected a timestamp, got {describe(x)}")

    return convert


def _parse_rfc3339(text: str, per_second: int) -> int:
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise EncodeError(f"not an RFC 3339 timestamp: {clipped(text)}")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    fraction, sign, offset_h, offset_m = match.group(7, 8, 9, 10)
    try:
        days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError as e:
        raise EncodeError(f"invalid date in {clipped(text)}: {e}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise EncodeError(
            f"invalid time of day in {clipped(text)} (leap seconds are not supported)"
        )
    seconds = days * 86400 + hour * 3600 + minute * 60 + second
    if sign:
        if int(offset_h) > 23 or int(offset_m) > 59:
            raise EncodeError(f"invalid UTC offset in {clipped(text)}")
        offset = int(offset_h) * 3600 + int(offset_m) * 60
        seconds -= offset if sign == "+" else -offset
    if not fraction:
        return seconds * per_second
    fraction = fraction[:_FRACTION_DIGITS]
    scale: int = 10 ** len(fraction)
    return (seconds * scale + int(fraction)) * per_second // scale


def _element_converter(spec: FeatureSpec, from_json: bool = False) -> Callable[[Any], Any]:
    """The converter of one value; ``from_json``: for values parsed by orjson, where a float
    for an int64 feature raises :class:`_NeedsText`."""
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


def _default_converter(spec: FeatureSpec) -> Callable[[Any], list[Any]]:
    """The converter of a default: a ``length`` feature's default is the count itself."""
    return _value_converter(spec.model_copy(update={"length": False}) if spec.length else spec)


def _getter(path: tuple[PathStep, ...], text: str) -> Callable[[Any], Any]:
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


_Plan = tuple[
    str, str | None, Callable[[Any], Any], Callable[[Any], list[Any]], Any, bool, frozenset[type]
]
"""(name, top-level key or None, getter, converter, default values or None, required, the types
of a scalar that is written as is)."""


CompiledFeature = tuple[bytes, bytes, str, bool, bytes | None]
"""One feature as :meth:`ExampleSchema.compiled_json_features` describes it to compiled code:
(name, JSON key, type, required, default entry)."""


def _compile_feature(name: str, spec: FeatureSpec, from_json: bool = False) -> _Plan:
    text = spec.path if spec.path is not None else name
    path = parse_path(spec.path) if spec.path is not None else ((name, None),)
    key = path[0][0] if len(path) == 1 and path[0][1] is None else None
    convert = _value_converter(spec, from_json)
    default = None
    if spec.default is not None:
        default = _default_converter(spec)(spec.default)
    special = spec.shape is not None or spec.time_unit is not None or spec.length
    plain = frozenset() if special else _PLAIN_TYPES[spec.type]
    return name, key, _getter(path, text), convert, default, spec.required, plain


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
    per_second = _PER_SECOND[unit]
    digits_scale = _SCALE[unit]

    def convert(text: str) -> int:
        t = text.strip()
        if _DECIMAL_TEXT.fullmatch(t) is not None:
            return _timestamp_int(t, digits_scale)
        return _parse_rfc3339(t, per_second)

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


_CsvPlan = tuple[str, str, Callable[[Any], list[Any]], Any, bool]
"""(name, header name, converter, default values or None, required)."""


def _compile_csv_feature(name: str, spec: FeatureSpec) -> _CsvPlan:
    default = _default_converter(spec)(spec.default) if spec.default is not None else None
    header = spec.path if spec.path is not None else name
    return name, header, _csv_converter(spec), default, spec.required


def _specs(
    features: Mapping[str, FeatureSpec | str | Mapping[str, Any]], where: str
) -> dict[str, FeatureSpec]:
    specs: dict[str, FeatureSpec] = {}
    errors: list[str] = []
    for name, value in features.items():
        try:
            specs[name] = parse_feature(value)
        except pydantic.ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(p) for p in (where, name, *err["loc"]))
                errors.append(f"{loc}: {err['msg']}")
    if errors:
        raise ConfigError(errors)
    return specs


_EXACT_JSON = json.JSONDecoder(parse_float=_TextFloat)


def _exact_event(payload: bytes, parsed: Any) -> Any:
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


def _not_an_object(event: Any) -> EncodeError:
    return EncodeError(f"not an object: got {describe(event)}")


class ExampleSchema:
    """Features of a ``tf.train.Example``, compiled once; :meth:`encode` turns events into bytes.

    ``features`` maps each feature name to its :class:`FeatureSpec` (or the short or long config
    form of one). Invalid specs raise :class:`~tfrecordd.errors.ConfigError` listing them all.
    """

    def __init__(self, features: Mapping[str, FeatureSpec | str | Mapping[str, Any]]) -> None:
        self.features: dict[str, FeatureSpec] = _specs(features, "features")
        """The features as declared, in declaration order."""
        self._writer = ExampleWriter([(name, spec.type) for name, spec in self.features.items()])
        self._plan = tuple(_compile_feature(name, spec) for name, spec in self.features.items())
        self._json_plan = tuple(
            _compile_feature(name, spec, True) for name, spec in self.features.items()
        )
        self._csv_plan = tuple(
            _compile_csv_feature(name, spec) for name, spec in self.features.items()
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
        is taken as :meth:`encode` takes it. Raises ``orjson.JSONDecodeError`` for a payload
        that is not JSON, else as :meth:`encode`.
        """
        event = orjson.loads(payload) if parsed is None else parsed
        try:
            return self._encode(event, self._json_plan)
        except _NeedsText:
            return self._encode(_exact_event(payload, event), self._plan)

    def _encode(self, event: Any, plan: tuple[_Plan, ...]) -> bytes:
        if event.__class__ is not dict and not isinstance(event, Mapping):
            raise _not_an_object(event)
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
        no other feature reads, and has no ``shape``, ``time_unit`` or ``length``. Each feature is
        ``(name, JSON key, type, required, default entry)``: name and key as UTF-8, the type's
        name, and the serialized map field that :meth:`encode` writes for a missing value, or
        ``None`` when it leaves the feature out.
        """
        out: list[CompiledFeature] = []
        keys: set[str] = set()
        for (name, key, _, _, default, required, _), spec in zip(
            self._plan, self.features.values(), strict=True
        ):
            special = spec.shape is not None or spec.time_unit is not None or spec.length
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
            out.append((name_bytes, key_bytes, spec.type.value, required, entry))
        return tuple(out)

    def encode_csv(self, row: Mapping[str, Any]) -> bytes:
        """Serialize the ``Example`` for one CSV row: header name → field text.

        Each feature's ``path`` is a header name (default: the feature's name); the text is
        converted as the module's CSV rules say. Raises :class:`~tfrecordd.errors.EncodeError`
        naming the feature at fault.
        """
        if not isinstance(row, Mapping):
            raise _not_an_object(row)
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


class SequenceSchema:
    """Context features and feature lists of a ``tf.train.SequenceExample``, compiled once.

    Without ``steps``, each feature list's ``path`` points at an array holding one value per step
    (``{"tokens": ["I", "saw"], "labels": [1, 0]}``), and all arrays present must have the same
    length. With ``steps``, a path to an array of step objects, each feature list's ``path`` is
    relative to a step (``{"words": [{"text": "I", "tag": 1}, ...]}``); the steps array must be
    present. A step without a value gets the feature's ``default``, is refused if the feature is
    ``required``, and is otherwise written as an empty value list, so steps stay aligned.

    The sequence length goes in the context as an ``int64`` feature with ``length = true`` whose
    ``path`` points at the steps array (or any of the parallel arrays).
    """

    def __init__(
        self,
        context: Mapping[str, FeatureSpec | str | Mapping[str, Any]],
        feature_lists: Mapping[str, FeatureSpec | str | Mapping[str, Any]],
        steps: str | None = None,
    ) -> None:
        self.context: dict[str, FeatureSpec] = _specs(context, "context")
        """The context features as declared."""
        self.feature_lists: dict[str, FeatureSpec] = _specs(feature_lists, "feature_lists")
        """The feature lists as declared; each spec describes the value of one step."""
        self.steps: str | None = steps
        """The path to the array of step objects, if the steps are objects."""
        errors = [
            f"feature_lists.{name}: length applies to context features only"
            for name, spec in self.feature_lists.items()
            if spec.length
        ]
        steps_path: tuple[PathStep, ...] = ()
        if steps is not None:
            try:
                steps_path = parse_path(steps)
            except ValueError as e:
                errors.append(f"steps: {e}")
        if errors:
            raise ConfigError(errors)
        self._steps = _getter(steps_path, steps) if steps is not None else None
        self._context = tuple(_compile_feature(n, s) for n, s in self.context.items())
        self._lists = tuple(_compile_feature(n, s) for n, s in self.feature_lists.items())
        self._json_context = tuple(_compile_feature(n, s, True) for n, s in self.context.items())
        self._json_lists = tuple(
            _compile_feature(n, s, True) for n, s in self.feature_lists.items()
        )
        self._writer = SequenceExampleWriter(
            [(n, s.type) for n, s in self.context.items()],
            [(n, s.type) for n, s in self.feature_lists.items()],
        )

    def encode(self, event: Any) -> bytes:
        """Serialize the ``SequenceExample`` for one decoded JSON object.

        Values are taken as :meth:`ExampleSchema.encode` takes them. Raises
        :class:`~tfrecordd.errors.EncodeError` naming the feature (or feature list) at fault; a
        step's problem is reported as ``"step <i>: <reason>"``.
        """
        return self._encode(event, self._context, self._lists)

    def encode_json(self, payload: bytes, parsed: Any = None) -> bytes:
        """Serialize the ``SequenceExample`` for one JSON text, every number taken exactly as
        written (as :meth:`ExampleSchema.encode_json` does)."""
        event = orjson.loads(payload) if parsed is None else parsed
        try:
            return self._encode(event, self._json_context, self._json_lists)
        except _NeedsText:
            return self._encode(_exact_event(payload, event), self._context, self._lists)

    def _encode(
        self, event: Any, context_plan: tuple[_Plan, ...], lists_plan: tuple[_Plan, ...]
    ) -> bytes:
        if not isinstance(event, Mapping):
            raise _not_an_object(event)
        context: list[list[Any] | None] = []
        name = None
        try:
            for name, key, get, convert, default, required, plain in context_plan:  # noqa: B007
                raw = event.get(key) if key is not None else get(event)
                if raw.__class__ in plain:
                    context.append([raw])
                elif raw is None:
                    if required:
                        raise EncodeError("missing required feature")
                    context.append(default)
                else:
                    context.append(convert(raw))
            name = None
            if self._steps is not None:
                lists = self._by_steps(event, lists_plan)
            else:
                lists = self._parallel(event, lists_plan)
        except EncodeError as e:
            raise EncodeError(e.reason, e.feature or name) from None
        return self._writer.encode(context, lists)

    def _by_steps(self, event: Any, plan: tuple[_Plan, ...]) -> list[list[list[Any]] | None]:
        assert self._steps is not None
        steps = self._steps(event)
        if steps is None:
            raise EncodeError(f"missing steps array {self.steps!r}")
        if not isinstance(steps, list):
            raise EncodeError(f"steps {self.steps!r}: expected a list, got {describe(steps)}")
        for i, step in enumerate(steps):
            if not isinstance(step, Mapping):
                raise EncodeError(f"step {i} is not an object: got {describe(step)}")
        lists: list[list[list[Any]] | None] = []
        for name, key, get, convert, default, required, _ in plan:
            values = []
            i = 0
            try:
                for i, step in enumerate(steps):  # noqa: B007
                    raw = step.get(key) if key is not None else get(step)
                    values.append(_step_value(raw, convert, default, required))
            except EncodeError as e:
                raise EncodeError(f"step {i}: {e.reason}", name) from None
            lists.append(values)
        return lists

    def _parallel(self, event: Any, plan: tuple[_Plan, ...]) -> list[list[list[Any]] | None]:
        lists: list[list[list[Any]] | None] = []
        first: tuple[str, int] | None = None
        for name, key, get, convert, default, required, _ in plan:
            try:
                raw = event.get(key) if key is not None else get(event)
            except EncodeError as e:
                raise EncodeError(e.reason, name) from None
            if raw is None:
                if required:
                    raise EncodeError("missing required feature list", name)
                lists.append(None)
                continue
            if not isinstance(raw, list):
                raise EncodeError(
                    f"expected a list with one value per step, got {describe(raw)}", name
                )
            if first is None:
                first = (name, len(raw))
            elif len(raw) != first[1]:
                raise EncodeError(
                    f"length mismatch: {len(raw)} steps, but {first[0]!r} has {first[1]}", name
                )
            values = []
            i = 0
            try:
                for i, x in enumerate(raw):  # noqa: B007
                    values.append(_step_value(x, convert, default, required))
            except EncodeError as e:
                raise EncodeError(f"step {i}: {e.reason}", name) from None
            lists.append(values)
        return lists


def _step_value(
    raw: Any, convert: Callable[[Any], list[Any]], default: Any, required: bool
) -> list[Any]:
    if raw is None:
        if required:
            raise EncodeError("missing required value")
        return default if default is not None else []
    return convert(raw)


_DTYPES = {FeatureType.INT64: "int64", FeatureType.FLOAT: "float32", FeatureType.BYTES: "string"}


def _reshape(flat: list[Any], shape: list[int]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_reshape(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _jsonable_default(spec: FeatureSpec, shape: list[int]) -> Any:
    flat = [
        v.decode() if isinstance(v, bytes) else v for v in _default_converter(spec)(spec.default)
    ]
    return _reshape(flat, shape)


def _context_description(spec: FeatureSpec) -> dict[str, Any]:
    dtype = _DTYPES[spec.type]
    shape = [] if spec.length else spec.shape
    if shape is None or not (spec.required or spec.default is not None):
        return {"kind": "VarLenFeature", "dtype": dtype}
    out: dict[str, Any] = {"kind": "FixedLenFeature", "shape": list(shape), "dtype": dtype}
    if spec.default is not None:
        out["default_value"] = _jsonable_default(spec, shape)
    return out


def _sequence_description(spec: FeatureSpec) -> dict[str, Any]:
    dtype = _DTYPES[spec.type]
    if spec.shape is None or not (spec.required or spec.default is not None):
        return {"kind": "VarLenFeature", "dtype": dtype}
    return {
        "kind": "FixedLenSequenceFeature",
        "shape": list(spec.shape),
        "dtype": dtype,
        "allow_missing": not spec.required,
    }


def feature_description(schema: ExampleSchema | SequenceSchema) -> dict[str, Any]:
    """The reader's ``tf.io`` feature description of ``schema``, as JSON-serializable data.

    For an :class:`ExampleSchema`: ``{name: description}`` for ``tf.io.parse_example``. For a
    :class:`SequenceSchema`: ``{"context_features": {...}, "sequence_features": {...}}``, the two
    arguments of ``tf.io.parse_sequence_example``.

    A description is ``{"kind": "FixedLenFeature", "shape", "dtype"[, "default_value"]}`` for a
    feature whose every record holds exactly its ``shape`` (declared, or ``[]`` for a ``length``)
    because it is required or has a default; ``{"kind": "FixedLenSequenceFeature", "shape",
    "dtype", "allow_missing"}`` for such a feature list; ``{"kind": "VarLenFeature", "dtype"}``
    otherwise. ``dtype`` is a ``tf.dtypes`` name: ``int64``, ``float32`` or ``string``.
    """
    if isinstance(schema, ExampleSchema):
        return {name: _context_description(spec) for name, spec in schema.features.items()}
    return {
        "context_features": {n: _context_description(s) for n, s in schema.context.items()},
        "sequence_features": {n: _sequence_description(s) for n, s in schema.feature_lists.items()},
    }


def _literal(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def _render_one(desc: Mapping[str, Any]) -> str:
    args = []
    if "shape" in desc:
        args.append(f"shape={list(desc['shape'])!r}")
    args.append(f"dtype=tf.{desc['dtype']}")
    if "default_value" in desc:
        args.append(f"default_value={_literal(desc['default_value'])}")
    if "allow_missing" in desc:
        args.append(f"allow_missing={desc['allow_missing']!r}")
    return f"tf.io.{desc['kind']}({', '.join(args)})"


def _render_dict(features: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [f"    {name!r}: {_render_one(desc)}," for name, desc in features.items()]
    return "{\n" + "\n".join(lines) + "\n}" if lines else "{}"


def render_feature_description(description: Mapping[str, Any]) -> str:
    """Python source for a :func:`feature_description` result, using ``tf.io`` names.

    An Example description renders as one dict expression; a sequence description as two
    assignments, ``context_features = {...}`` and ``sequence_features = {...}``.
    """
    if set(description) == {"context_features", "sequence_features"} and all(
        "kind" not in v for v in description.values()
    ):
        return (
            f"context_features = {_render_dict(description['context_features'])}\n"
            f"sequence_features = {_render_dict(description['sequence_features'])}\n"
        )
    return _render_dict(description)
