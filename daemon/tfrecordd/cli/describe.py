"""``tfrecordd schema``: the reader's side of an encoder's schema (``tf.io`` feature descriptions).

``tfrecordd schema --config FILE [--encoder NAME] [--format python|json]`` prints what reads the
records that encoder writes. ``--format python`` (the default) prints a script to paste into a
reader::

    import tensorflow as tf

    # encoder 'movies' (type 'example'): tf.io.parse_example(serialized, features)
    features = {
        'age': tf.io.FixedLenFeature(shape=[], dtype=tf.int64),
        'movie': tf.io.VarLenFeature(dtype=tf.string),
    }

and for a sequence encoder two dicts, ``context_features`` and ``sequence_features``, for
``tf.io.parse_sequence_example``. ``--format json`` prints the same as data: for an Example
encoder ``{name: {"kind", "dtype"[, "shape"][, "default_value"]}}``, for a sequence encoder
``{"context_features": {...}, "sequence_features": {...}}`` (see
:func:`tfrecordd.schema.schema.feature_description`). The output is strict JSON: a NaN or infinite
``default_value`` is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, which ``float()``
reads back.

An encoder config describes its output through a ``feature_description()`` method returning that
data; one without the method (or whose records it cannot know, like ``passthrough``) is an error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_OK, TfrecorddError
from tfrecordd.plugin import EncoderConfig
from tfrecordd.schema.schema import render_feature_description

__all__ = ["add_commands", "describe_encoder", "render_python"]


def describe_encoder(name: str, config: EncoderConfig) -> dict[str, Any]:
    """The feature description of the encoder configured as ``[encoders.NAME]``."""
    describe = getattr(config, "feature_description", None)
    if describe is None:
        raise TfrecorddError(
            f"encoder {name!r} (type {config.type!r}) cannot describe its records: "
            "its plugin has no feature_description()"
        )
    try:
        description: dict[str, Any] = describe()
    except TfrecorddError as e:
        raise TfrecorddError(f"encoder {name!r} (type {config.type!r}): {e}") from None
    return description


def _is_sequence(description: dict[str, Any]) -> bool:
    return set(description) == {"context_features", "sequence_features"} and all(
        "kind" not in v for v in description.values()
    )


def render_python(name: str, config: EncoderConfig, description: dict[str, Any]) -> str:
    """A reader's script: ``import tensorflow as tf`` and the feature dict(s) to pass to
    ``tf.io.parse_example`` (``features``) or ``tf.io.parse_sequence_example``
    (``context_features``, ``sequence_features``)."""
    where = f"encoder {name!r} (type {config.type!r})"
    if _is_sequence(description):
        call = "tf.io.parse_sequence_example(serialized, context_features, sequence_features)"
        body = render_feature_description(description)
    else:
        call = "tf.io.parse_example(serialized, features)"
        body = f"features = {render_feature_description(description)}\n"
    return f"import tensorflow as tf\n\n# {where}: {call}\n{body}"


def _strict_json(value: Any) -> Any:
    """``value`` with each NaN or infinite float as the string JSON has no number for."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(v) for v in value]
    return value


def _schema(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    names = sorted(config.encoders)
    name = args.encoder
    if name is None:
        if len(names) != 1:
            raise TfrecorddError(
                f"{args.config}: {len(names)} encoders, choose one with --encoder: "
                + ", ".join(names)
            )
        name = names[0]
    if name not in config.encoders:
        raise TfrecorddError(
            f"{args.config}: no [encoders.{name}] table (encoders: {', '.join(names) or 'none'})"
        )
    encoder = config.encoders[name]
    description = describe_encoder(name, encoder)
    if args.format == "json":
        json.dump(_strict_json(description), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_python(name, encoder, description))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register ``schema`` on the CLI's subparsers."""
    help = help_of("schema")
    p: argparse.ArgumentParser = sub.add_parser("schema", help=help, description=help)
    p.add_argument("--config", "-c", required=True, help="the TOML config file")
    p.add_argument(
        "--encoder", metavar="NAME", help="the [encoders.NAME] table (default: the only one)"
    )
    p.add_argument(
        "--format",
        choices=["python", "json"],
        default="python",
        help="Python source for a reader, or JSON data (default: %(default)s)",
    )
    p.set_defaults(func=_schema)
