"""The config in effect, as TOML: every default filled in, every ``${…}`` substituted, and every
secret masked (``tfrecordd check-config --show``).

A value is masked (``"***"``) when the setting or table key it is the value of looks secret
(:func:`~tfrecordd.secretvalues.is_secret_key`), and so is every value read from a secret file
or credential, or a secret-looking variable, wherever it appears (:mod:`tfrecordd.secretvalues`);
a URL keeps all but its password (:mod:`tfrecordd.redact`), and ``storage_options`` only the
values of keys known to be harmless. The keys of the tables a user names
(:data:`~tfrecordd.secretvalues.NAMED_TABLES`: features, labels, a route's values) are names,
never masked for what they say: a feature named ``api_key`` is shown as declared, and the shown
config loads back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tfrecordd import secretvalues
from tfrecordd.redact import REDACTED, redact_options, redact_text
from tfrecordd.schema.infer_toml import toml_value

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

OCTAL_KEYS = frozenset({"mode"})
"""Keys whose integer values are file modes, shown in octal (``0o660``)."""
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def effective(config: DaemonConfig) -> dict[str, Any]:
    """The config in effect as a TOML-ready mapping, secrets masked."""
    exclude: set[str] = {"path"}
    if config.output is not None:
        exclude.add("datasets")  # derived from [output]: both in one file is refused
    return masked(config, exclude)


def masked(model: BaseModel, exclude: set[str] | None = None) -> dict[str, Any]:
    """``model`` dumped as JSON values (``None`` left out), every secret masked."""
    data = model.model_dump(mode="json", exclude_none=True, exclude=exclude)
    out = _mask(model, data, None)
    assert isinstance(out, dict)
    return out


def _mask(model: Any, value: Any, setting: str | None) -> Any:
    """``value`` (``model`` dumped) with its secrets masked; ``setting``: the field of a model
    or the key of a table that ``value`` is the value of (``None``: a name a user chose, the key
    of a table in :data:`~tfrecordd.secretvalues.NAMED_TABLES`, or the top)."""
    if isinstance(value, dict):
        if setting == "storage_options":
            return redact_options(value)
        if isinstance(model, BaseModel):
            return {k: _mask(getattr(model, k, None), v, k) for k, v in value.items()}
        items = model if isinstance(model, Mapping) else {}
        names = setting in secretvalues.NAMED_TABLES
        return {k: _mask(items.get(k), v, None if names else k) for k, v in value.items()}
    if isinstance(value, list):
        models = (
            model if isinstance(model, list) and len(model) == len(value) else [None] * len(value)
        )
        return [_mask(m, v, setting) for m, v in zip(models, value, strict=True)]
    if isinstance(value, str):
        if value and setting is not None and secretvalues.is_secret_key(setting):
            return REDACTED
        return secretvalues.mask(redact_text(value))
    return value


def to_toml(data: dict[str, Any]) -> str:
    """``data`` (str keys; str, int, float, bool, list and dict values) as a TOML document."""
    lines: list[str] = []
    _table(data, [], lines, header=None)
    return "\n".join(lines).strip("\n") + "\n"


def _key(name: str) -> str:
    return name if _BARE.match(name) else json.dumps(name)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(data: dict[str, Any], path: list[str], lines: list[str], header: str | None) -> None:
    scalars = [k for k, v in data.items() if not _is_table(v) and not _is_table_array(v)]
    if header is not None and (scalars or len(scalars) == len(data)):
        lines += ["", header]  # a table of tables alone needs no header of its own
    for k, v in data.items():
        if not _is_table(v) and not _is_table_array(v):
            lines.append(f"{_key(k)} = {_value(v, k)}")
    for k, v in data.items():
        dotted = ".".join(_key(p) for p in [*path, k])
        if _is_table(v):
            _table(v, [*path, k], lines, f"[{dotted}]")
        elif _is_table_array(v):
            for item in v:
                _table(item, [*path, k], lines, f"[[{dotted}]]")


def _value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"0o{value:o}" if key in OCTAL_KEYS and value >= 0 else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, key) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v, k)}" for k, v in value.items()) + " }"
    return _string(str(value))


def _string(value: str) -> str:
    # String values are substituted when the config loads (tfrecordd.interpolate): `$$` keeps
    # a `$` of the effective value, so the shown config loads back as the same config.
    return toml_value(value)
