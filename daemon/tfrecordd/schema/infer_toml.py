"""The features an :class:`~tfrecordd.schema.infer.Inference` proposes, and the TOML table that
declares them (``tfrecordd schema --infer``): each feature under a comment giving the reason for
each choice, each field left out with the reason, the lines that did not fit."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

from tfrecordd.format.wire import INT64_MAX, INT64_MIN
from tfrecordd.schema.infer import Field, Inference

__all__ = ["Proposal", "propose", "render_toml", "toml_key", "toml_string", "toml_value"]

_TIME_NAME = re.compile(
    r"(?:^|[_\-.])(?:ts|t|time|times|timestamp|datetime|epoch|date|when)(?:$|[_\-.])|_at$|time",
    re.IGNORECASE,
)
_EPOCHS = (
    ("seconds", 946_684_800, 4_102_444_800),  # 2000-01-01 to 2100-01-01
    ("milliseconds", 946_684_800_000, 4_102_444_800_000),
    ("microseconds", 946_684_800_000_000, 4_102_444_800_000_000),
    ("nanoseconds", 946_684_800_000_000_000, 4_102_444_800_000_000_000),
)
_UNITS = ("s", "ms", "us", "ns")
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
_NUMBERS = {"int", "bigint", "float"}
_WHY_OUT = {
    "bool": "holds true/false, which int64 and float refuse (a producer's 0/1 is int64)",
    "null": "a list holds null, which no feature type takes",
    "object": "a list of objects: a path reaches one of them (`items[0].id`), not every one",
}


@dataclass
class Proposal:
    """One field's feature (``spec``, its TOML table) and the reasons for it, or ``spec`` None:
    left out, for the reasons given."""

    name: str
    spec: dict[str, Any] | None
    reasons: list[str] = field(default_factory=list)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _lines_of(fld: Field, total: int, noun: str) -> str:
    if fld.present == total:
        return f"in all {_plural(total, noun)}" if total > 1 else f"in the one {noun}"
    return f"in {fld.present} of {_plural(total, noun)}"


def _unit_for(digits: int) -> str:
    return _UNITS[min(3, (digits + 2) // 3)]


def _fits_int64(fld: Field, per_second: int) -> bool:
    """Whether the count of ``1 / per_second`` s of each timestamp seen is an int64."""
    low, high = fld.low or 0, fld.high or 0
    return (low - 1) * per_second >= INT64_MIN and (high + 1) * per_second <= INT64_MAX


def _epoch(name: str, fld: Field) -> str | None:
    if not _TIME_NAME.search(name) or fld.low is None or fld.high is None or fld.nonfinite:
        return None
    if fld.kinds["bigint"] or fld.kinds["huge"]:
        return None  # numbers past int64: no count of any unit
    for what, low, high in _EPOCHS:
        if low <= fld.low and fld.high <= high:
            return what
    return None


def _left_out(name: str, fld: Field, fmt: str) -> str | None:
    """Why the field cannot be a feature without dead-lettering a line of the sample."""
    if fld.objects and fld.present:
        return f"an object in {fld.objects} lines, a value in {fld.present}: no path takes both"
    for kind, why in _WHY_OUT.items():
        if fld.kinds[kind]:
            return why
    if fld.kinds["huge"] and fmt == "jsonl":
        return "numbers beyond float32's range, which no feature type holds"
    if fmt == "jsonl" and fld.kinds.keys() & _NUMBERS and fld.kinds.keys() & {"str", "time"}:
        return (
            "numbers in some lines and strings in others: from JSON, bytes take strings only "
            "and int64 and float numbers only"
        )
    nested = [s for s in fld.shapes if len(s) != 1]
    if nested:
        if () in fld.shapes:
            return "nested lists of differing lengths (ragged): a nested list needs a fixed shape"
        if len(fld.shapes) > 1 or fld.scalars:
            return "lists nested in some lines and not in others: one shape cannot take both"
        if 0 in nested[0]:
            return "empty inner lists: every dimension of a shape is at least 1"
    if len(fld.path) > 1 and any(not k or set(k) & set(".[]") for k in fld.path):
        return "a key holds '.', '[' or ']' (or is empty): no path can name it"
    return None


def _typed(name: str, fld: Field, fmt: str, spec: dict[str, Any], why: list[str]) -> None:
    """The feature's ``type`` (and ``time_unit``), with the reason."""
    kinds = {k for k, n in fld.kinds.items() if n}
    if not kinds:
        spec["type"] = "bytes"
        why.append("bytes: only empty lists seen, any type takes them; set the type you mean")
        return
    if kinds == {"time"}:
        unit = _unit_for(fld.fraction_digits)
        while unit != "s" and not _fits_int64(fld, _PER_SECOND[unit]):
            unit = _UNITS[_UNITS.index(unit) - 1]
        spec.update(type="int64", time_unit=unit)
        digits = fld.fraction_digits
        fine = f"fractions of up to {_plural(digits, 'digit')}" if digits else "whole seconds"
        why.append(f'int64 time_unit "{unit}": RFC 3339 timestamps, {fine}')
        return
    if kinds & {"str", "time"} or (kinds & {"huge", "bigint"} and fmt == "csv"):
        spec["type"] = "bytes"
        if kinds & _NUMBERS or "huge" in kinds:
            if kinds & {"str", "time"}:
                why.append("bytes: numbers in some rows, text in others; kept as text")
            else:
                why.append("bytes: integers beyond int64 (or beyond float32), kept exact as text")
        elif "time" in kinds:
            why.append("bytes: RFC 3339 timestamps and other text")
        else:
            why.append("bytes: text")
        return
    epoch = _epoch(name, fld)
    if epoch == "seconds":
        unit = "s" if kinds == {"int"} else _unit_for(fld.fraction_digits)
        spec.update(type="int64", time_unit=unit)
        why.append(f'int64 time_unit "{unit}": named like a time, epoch seconds (2000 to 2100)')
        return
    if kinds == {"int"}:
        spec["type"] = "int64"
        if epoch is not None:
            why.append(
                f"int64: named like a time, epoch {epoch} (2000 to 2100), written as they are "
                "(time_unit reads numbers as seconds)"
            )
        else:
            why.append("int64: integers")
        return
    spec["type"] = "float"
    if "bigint" in kinds:
        why.append("float: integers beyond int64, which float32 rounds to about 7 digits")
    elif "int" in kinds:
        why.append("float: integers and fractions")
    else:
        why.append("float: fractions (written as float32)")


def _shaped(fld: Field, total: int, noun: str, spec: dict[str, Any], why: list[str]) -> None:
    """``required`` and ``shape``, with the reasons."""
    required = fld.present == total
    if required:
        spec["required"] = True
    why.append(("required: " if required else "optional: ") + _lines_of(fld, total, noun))
    shapes = [s for s in fld.shapes if s]
    if shapes and len(shapes[0]) > 1:
        spec["shape"] = list(shapes[0])
        why.append(f"shape {list(shapes[0])}: nested lists, all of these dimensions")
    elif not required:
        return
    elif not fld.shapes:
        spec["shape"] = []
        why.append(f"shape []: one value in each {noun}")
    elif not fld.scalars and len(fld.shapes) == 1 and shapes and shapes[0][0] > 0:
        spec["shape"] = list(shapes[0])
        why.append(f"shape {list(shapes[0])}: a list of {shapes[0][0]} in each {noun}")
    elif fld.scalars:
        why.append(f"no shape: one value in some {noun}s, a list in others")
    elif shapes == [(0,)]:
        why.append("no shape: empty lists only")
    else:
        why.append("no shape: lists of differing lengths")


def _noun(inf: Inference) -> str:
    return "row" if inf.format == "csv" else "line"


def propose(inf: Inference) -> list[Proposal]:
    """A feature (or the reason for none) for each field of ``inf`` that holds values."""
    out: list[Proposal] = []
    names: set[str] = set()
    for path, fld in inf.fields.items():
        if fld.objects and not fld.present:
            continue  # an object: its keys are fields
        name = ".".join(path)
        parents = [inf.fields.get(path[:i]) for i in range(1, len(path))]
        why_out = _left_out(name, fld, inf.format)
        if why_out is None and any(p is not None and p.present for p in parents):
            why_out = "a parent key holds a value (not an object) in some lines"
        if why_out is None and name in names:
            why_out = f"the name {name!r} is taken by another field"
        if why_out is not None:
            out.append(Proposal(name, None, [why_out]))
            continue
        names.add(name)
        spec: dict[str, Any] = {}
        why: list[str] = []
        _typed(path[-1], fld, inf.format, spec, why)
        if len(path) > 1:
            spec["path"] = name
        _shaped(fld, inf.records, _noun(inf), spec, why)
        out.append(Proposal(name, spec, why))
    return out


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(text: str) -> str:
    """``text`` as a TOML string value that reads back as ``text``: the config substitutes
    ``${...}`` and ``$$`` in string values (:mod:`tfrecordd.interpolate`), so each ``$`` is
    written ``$$`` (keys are not substituted: :func:`toml_key` keeps them as they are)."""
    return toml_string(text.replace("$", "$$"))


def toml_key(key: str) -> str:
    """``key`` as a TOML key: bare where it may be."""
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def _value(value: Any) -> str:
    if value is True:
        return "true"
    if isinstance(value, str):
        return toml_value(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _comment(text: str) -> str:
    """``text`` safe in a TOML comment: one line, no control characters."""
    return "".join(ch if ch >= " " and ch != "\x7f" else " " for ch in text)


def render_toml(inf: Inference, encoder: str, proposals: list[Proposal]) -> str:
    """The ``[encoders.NAME]`` table of ``proposals``, with comments, to paste into a config."""
    noun = _noun(inf)
    what = "JSON lines" if inf.format == "jsonl" else "CSV rows"
    lines = [f"# tfrecordd schema --infer: {inf.records} {what} that fit, sampled from"]
    for name, count, whole in inf.files:
        read = f"{'all' if whole else 'the first'} {_plural(count, 'line')}"
        lines.append(_comment(f"#   {name}: {read}"))
    if inf.misfit_count:
        shown = len(inf.misfits)
        more = f" (the first {shown} below)" if shown < inf.misfit_count else ""
        did = f"{_plural(inf.misfit_count, noun)} did not fit"
        them = "it" if inf.misfit_count == 1 else "them"
        lines.append(f"# {did}; the daemon dead-letters {them}{more}:")
        lines += [_comment(f"#   {m.file}:{m.line}: {m.reason}") for m in inf.misfits]
    if inf.untracked:
        lines.append(f"# {inf.untracked} values of fields past the first 1000 were not read")
    table = f"encoders.{toml_key(encoder)}"
    use = _comment(f"encoder = {toml_value(encoder)}")
    lines.append(f"# Paste into the config, and set {use} on the source or dataset to encode.")
    lines += ["", f"[{table}]", 'type = "example"', "", f"[{table}.features]"]
    for p in proposals:
        if p.spec is None:
            continue
        wrapped = textwrap.wrap(_comment("; ".join(p.reasons)), 98, break_long_words=False)
        lines += ["# " + line for line in wrapped]
        if set(p.spec) == {"type"}:
            lines.append(f"{toml_key(p.name)} = {_value(p.spec['type'])}")
        else:
            body = ", ".join(f"{k} = {_value(v)}" for k, v in p.spec.items())
            lines.append(f"{toml_key(p.name)} = {{ {body} }}")
    left = [p for p in proposals if p.spec is None]
    if left:
        lines += ["", "# Left out: each would dead-letter lines of the sample."]
        lines += [_comment(f"#   {p.name}: {p.reasons[0]}") for p in left]
    return "\n".join(lines) + "\n"
