"""Field partitions' values as folder names: ``NAME=value``, or ``NAME=_other``."""

from __future__ import annotations

import math
import re
import struct

__all__ = ["OTHER", "float32_short", "sanitize"]

OTHER = "_other"
"""The value of a field whose own value is unsafe, missing, or over the cap."""

_SAFE_VALUE = re.compile(r"[A-Za-z0-9-][A-Za-z0-9_.-]{0,63}", re.ASCII)
_FLOAT32 = struct.Struct("<f")


def sanitize(value: object) -> str | None:
    """The folder value of a field value: ``int`` as decimal text, ``float`` as its repr,
    ``bytes`` decoded as UTF-8, ``str`` as it is; ``None`` (unsafe) unless the text is 1 to 64
    of ``A-Z a-z 0-9 _ . -`` and starts with neither ``.`` nor ``_`` (hidden and marker names),
    or for a value of another type."""
    if isinstance(value, bytes | str):
        if len(value) > 64:
            return None
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                return None
        text = value
    elif isinstance(value, bool):
        return None
    elif isinstance(value, int):
        if abs(value) >= 10**64:
            return None
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    else:
        return None
    return text if _SAFE_VALUE.fullmatch(text) else None


def float32_short(value: float) -> float:
    """The shortest float that a FloatList value was most likely written as (``0.1``)."""
    if math.isfinite(value):
        packed = _FLOAT32.pack(value)
        for digits in range(1, 10):
            short = float(f"{value:.{digits}g}")
            if _FLOAT32.pack(short) == packed:
                return short
    return value
