"""``tf.train.SequenceExample`` schemas: :class:`SequenceSchema`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tfrecordd.errors import ConfigError, EncodeError
from tfrecordd.format.wire import SequenceExampleWriter, describe
from tfrecordd.schema.json_values import (
    FeaturePlan,
    NeedsText,
    compile_feature,
    exact_event,
    load_event,
    not_an_object,
)
from tfrecordd.schema.paths import PathStep, getter, parse_path
from tfrecordd.schema.specs import FeatureSpec, parse_features

__all__ = ["SequenceSchema"]


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
        self.context: dict[str, FeatureSpec] = parse_features(context, "context")
        """The context features as declared."""
        self.feature_lists: dict[str, FeatureSpec] = parse_features(feature_lists, "feature_lists")
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
        self._steps = getter(steps_path, steps) if steps is not None else None
        self._context = tuple(compile_feature(n, s) for n, s in self.context.items())
        self._lists = tuple(compile_feature(n, s) for n, s in self.feature_lists.items())
        self._json_context = tuple(compile_feature(n, s, True) for n, s in self.context.items())
        self._json_lists = tuple(compile_feature(n, s, True) for n, s in self.feature_lists.items())
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
        event, wide = (parsed, False) if parsed is not None else load_event(payload)
        if wide:
            return self._encode(event, self._context, self._lists)
        try:
            return self._encode(event, self._json_context, self._json_lists)
        except NeedsText:
            return self._encode(exact_event(payload, event), self._context, self._lists)

    def _encode(
        self, event: Any, context_plan: tuple[FeaturePlan, ...], lists_plan: tuple[FeaturePlan, ...]
    ) -> bytes:
        if not isinstance(event, Mapping):
            raise not_an_object(event)
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

    def _by_steps(self, event: Any, plan: tuple[FeaturePlan, ...]) -> list[list[list[Any]] | None]:
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

    def _parallel(self, event: Any, plan: tuple[FeaturePlan, ...]) -> list[list[list[Any]] | None]:
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
