"""Durations (``"30s"``, ``"10m"``) and sizes (``"64MiB"``) as config values."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    None: 1,
}


def parse_duration(value: Any) -> float:
    """Seconds from ``"500ms"``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"`` or a bare number."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '30s', got a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a duration such as '30s', '10m' or '500ms', got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative (got {value!r})")
    return seconds


def parse_size(value: Any) -> int:
    """Bytes from ``"64MiB"``, ``"1GB"``, ``"512KiB"``, ``"100B"`` or a bare integer."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '64MiB', got a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = m.group(2).lower() if m.group(2) else None
        size = int(float(m.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ValueError(f"expected a size such as '64MiB', '1GB' or a byte count, got {value!r}")
    if size < 0:
        raise ValueError(f"a size cannot be negative (got {value!r})")
    return size


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` as a duration string."""
    for unit, factor in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= factor and seconds % factor == 0:
            return f"{int(seconds // factor)}{unit}"
    return f"{round(seconds * 1000)}ms" if seconds < 1 else f"{seconds:g}s"


def format_size(size: int) -> str:
    """The shortest exact binary-unit spelling of ``size``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)
]
"""A duration in seconds; config files spell it ``"30s"``, ``"10m"``, ``"500ms"``."""
Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(format_size, return_type=str)]
"""A size in bytes; config files spell it ``"64MiB"``, ``"1GB"``, ``"4096"``."""
