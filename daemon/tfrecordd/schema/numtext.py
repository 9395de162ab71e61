"""Numbers and timestamps read from their text exactly, with integer arithmetic on the digits."""

from __future__ import annotations

import math
import re
from datetime import date

from tfrecordd.errors import EncodeError
from tfrecordd.format.wire import INT64_MAX, INT64_MIN, clipped

__all__ = [
    "PER_SECOND",
    "SCALE",
    "clip_text",
    "decimal_int",
    "floor_of_any_text",
    "parse_rfc3339",
    "timestamp_int",
]

SCALE = {"s": 0, "ms": 3, "us": 6, "ns": 9}
PER_SECOND: dict[str, int] = {unit: 10**digits for unit, digits in SCALE.items()}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
_FRACTION_DIGITS = 9
"""Digits of a fraction of a second that can change a count of the finest unit (ns): the rest
are floored away, so they are not read."""
_NUMBER_TEXT = re.compile(r"\s*([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?)([0-9]+))?\s*")
_INT64_DIGITS = 19
"""Every integer of more digits is outside int64."""


def clip_text(text: str) -> str:
    """``text`` stripped and cut short enough to quote in a reason."""
    text = text.strip()
    return text if len(text) <= 40 else text[:37] + "..."


def decimal_int(text: str, digits_scale: int, floor: bool) -> int | None:
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
        raise EncodeError(f"int64 out of range: {clip_text(text)}")
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
        raise EncodeError(f"int64 out of range: {clip_text(text)}")
    return value


def timestamp_int(text: str, digits_scale: int) -> int:
    """A number of seconds written as ``text``, in units of ``10**-digits_scale`` s, floored."""
    value = decimal_int(text, digits_scale, True)
    assert value is not None
    return value


def floor_of_any_text(x: float, digits_scale: int) -> int | None:
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


def parse_rfc3339(text: str, per_second: int) -> int:
    """An RFC 3339 timestamp as a count of ``1 / per_second`` s since the epoch, floored."""
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
