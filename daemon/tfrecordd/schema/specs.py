"""Declared features: :class:`FeatureSpec`, its config forms, and their checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from tfrecordd.errors import ConfigError, EncodeError
from tfrecordd.format.wire import ExampleWriter, FeatureType
from tfrecordd.schema.json_values import default_values
from tfrecordd.schema.paths import parse_path

__all__ = ["FeatureSpec", "TimeUnit", "parse_feature", "parse_features"]

TimeUnit = Literal["s", "ms", "us", "ns"]


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
                values = default_values(self)
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


def parse_features(
    features: Mapping[str, FeatureSpec | str | Mapping[str, Any]], where: str
) -> dict[str, FeatureSpec]:
    """Each feature parsed (:func:`parse_feature`); raises :class:`~tfrecordd.errors.ConfigError`
    listing every invalid one, located under ``where`` (``features.age.type: ...``)."""
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
