"""``tfrecordd schema``: the reader's side of an encoder's schema (``tf.io`` feature descriptions).

``tfrecordd schema --config FILE [--dataset NAME] [--format python|json]`` prints what reads the
records of that dataset (those its encoder writes); with no ``--dataset``, of the config's only
dataset, and where it has several the error lists their names (exit 2). ``--encoder NAME``
describes an ``[encoders.NAME]`` table instead. ``--format python`` (the default) prints a
script to paste into a reader::

    import tensorflow as tf

    # dataset 'clicks', encoder 'clicks' (type 'example'): tf.io.parse_example(serialized, features)
    features = {
        'age': tf.io.FixedLenFeature(shape=[], dtype=tf.int64),
        'movie': tf.io.VarLenFeature(dtype=tf.string),
    }

and for a sequence encoder two dicts, ``context_features`` and ``sequence_features``, for
``tf.io.parse_sequence_example``. ``--format json`` prints the same as data: for an Example
encoder ``{name: {"kind", "dtype"[, "shape"][, "default_value"]}}``, for a sequence encoder
``{"context_features": {...}, "sequence_features": {...}}`` (see :func:`feature_description`).
The output is strict JSON: a NaN or infinite ``default_value`` is the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``, which ``float()`` reads back.

``tfrecordd schema --infer FILE... [--format jsonl|csv] [--sample N] [--name NAME]`` goes the
other way: it reads a sample of JSON lines or CSV files and prints an ``[encoders.NAME]`` table
of the features they hold (:mod:`tfrecordd.schema.infer`), each choice with its reason as a
comment, to paste into a config (docs/schema-inference.md).

An encoder config built on a declared schema returns it from ``declared_schema()``, and this
command describes the schema; any other encoder config describes its output through its
``feature_description()`` method returning that data, which raises for one whose records it cannot
know (like ``passthrough``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.cli.datasetargs import UsageError, add_dataset_options, choose_dataset
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_OK, TfrecorddError
from tfrecordd.format.wire import FeatureType
from tfrecordd.plugin import EncoderConfig
from tfrecordd.schema import ExampleSchema, FeatureSpec, SequenceSchema, default_values
from tfrecordd.schema.infer import SAMPLE_LINES, InferenceError, infer, input_format
from tfrecordd.schema.infer_toml import propose, render_toml

__all__ = [
    "add_commands",
    "describe_encoder",
    "feature_description",
    "render_feature_description",
    "render_python",
]

_DTYPES = {FeatureType.INT64: "int64", FeatureType.FLOAT: "float32", FeatureType.BYTES: "string"}


def _reshape(flat: list[Any], shape: list[int]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_reshape(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _jsonable_default(spec: FeatureSpec, shape: list[int]) -> Any:
    flat = [v.decode() if isinstance(v, bytes) else v for v in default_values(spec)]
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


def describe_encoder(name: str, config: EncoderConfig) -> dict[str, Any]:
    """The feature description of the encoder configured as ``[encoders.NAME]``: of its declared
    schema if it has one, else the one its config gives."""
    describe = getattr(config, "feature_description", None)
    if describe is None:
        raise TfrecorddError(
            f"encoder {name!r} (type {config.type!r}) cannot describe its records: "
            "its plugin has no feature_description()"
        )
    try:
        schema = config.declared_schema()
        if schema is not None:
            return feature_description(schema)
        description: dict[str, Any] = describe()
    except TfrecorddError as e:
        raise TfrecorddError(f"encoder {name!r} (type {config.type!r}): {e}") from None
    return description


def _is_sequence(description: dict[str, Any]) -> bool:
    return set(description) == {"context_features", "sequence_features"} and all(
        "kind" not in v for v in description.values()
    )


def render_python(
    name: str, config: EncoderConfig, description: dict[str, Any], *, dataset: str | None = None
) -> str:
    """A reader's script: ``import tensorflow as tf`` and the feature dict(s) to pass to
    ``tf.io.parse_example`` (``features``) or ``tf.io.parse_sequence_example``
    (``context_features``, ``sequence_features``); its comment names the ``dataset`` whose
    records these are, if given."""
    where = f"encoder {name!r} (type {config.type!r})"
    if dataset is not None:
        where = f"dataset {dataset!r}, {where}"
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


_INPUT_FORMATS = ("jsonl", "csv")


def _default_encoder_name(path: str) -> str:
    stem = Path(path).name.split(".")[0]
    return stem if re.fullmatch(r"[A-Za-z0-9_-]+", stem) else "inferred"


def _infer(args: argparse.Namespace) -> int:
    if args.config is not None or args.dataset is not None or args.encoder is not None:
        raise UsageError(
            "--infer reads files, not a config: leave out --config, --dataset, --encoder"
        )
    if args.format not in (None, *_INPUT_FORMATS):
        raise UsageError(
            f"with --infer, --format is the files' format: jsonl or csv, not {args.format}"
        )
    if args.sample < 1:
        raise UsageError(f"--sample must be at least 1, got {args.sample}")
    if len(args.csv_delimiter) != 1 or args.csv_delimiter in '"\r\n':
        raise UsageError(
            f"--csv-delimiter must be one character, not a quote or a line end: "
            f"got {args.csv_delimiter!r}"
        )
    if args.format is None:
        unknown = [p for p in args.infer if input_format(p) is None]
        if unknown:
            raise UsageError(
                f"{unknown[0]}: cannot tell JSON lines from CSV by its name (.jsonl, .ndjson, "
                ".json, .csv, each perhaps .gz): give --format jsonl or --format csv"
            )
        if len({input_format(p) for p in args.infer}) > 1:
            raise UsageError("JSON lines and CSV files given together: infer each on its own")
    inference = infer(args.infer, args.format, sample=args.sample, delimiter=args.csv_delimiter)
    proposals = propose(inference)
    if not any(p.spec is not None for p in proposals):
        why = "; ".join(f"{p.name}: {p.reasons[0]}" for p in proposals[:5])
        rows = "row" if inference.format == "csv" else "line"
        fit = f"{inference.records} {rows}{'' if inference.records == 1 else 's'}"
        bad = inference.misfit_count
        raise InferenceError(
            f"no feature to propose: no field of the {fit} sampled that fit holds a value a "
            f"feature type takes ({why or 'none holds a value'}); {bad} {rows}"
            f"{'' if bad == 1 else 's'} did not fit"
        )
    name = args.name or _default_encoder_name(args.infer[0])
    sys.stdout.write(render_toml(inference, name, proposals))
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    if args.infer is not None:
        return _infer(args)
    if args.config is None:
        raise UsageError(
            "give --config FILE (describe a dataset's records) or --infer FILE... "
            "(propose features from a sample of JSON lines or CSV)"
        )
    if args.format in _INPUT_FORMATS:
        raise UsageError(f"--format {args.format} is the input format of --infer FILE...")
    config = load_config(args.config)
    dataset: str | None = None
    name = args.encoder
    if name is not None and args.dataset is not None:
        raise UsageError("--dataset and --encoder each choose what to describe: give one")
    if name is None:
        dataset = choose_dataset(config, args.config, args.dataset)
        name = config.datasets[dataset].encoder
    elif name not in config.encoders:
        names = ", ".join(sorted(config.encoders)) or "none"
        raise UsageError(f"{args.config}: no [encoders.{name}] table (encoders: {names})")
    encoder = config.encoders[name]
    description = describe_encoder(name, encoder)
    if args.format == "json":
        json.dump(_strict_json(description), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_python(name, encoder, description, dataset=dataset))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register ``schema`` on the CLI's subparsers."""
    help = help_of("schema")
    p: argparse.ArgumentParser = sub.add_parser("schema", help=help, description=help)
    add_dataset_options(p)
    p.add_argument(
        "--encoder",
        metavar="NAME",
        help="describe the [encoders.NAME] table instead of a dataset's encoder",
    )
    p.add_argument(
        "--format",
        choices=["python", "json", *_INPUT_FORMATS],
        help="python (the default) or json: how to print a description; with --infer, the "
        "files' format, jsonl or csv (default: by suffix)",
    )
    p.add_argument(
        "--infer",
        nargs="+",
        metavar="FILE",
        help="print an [encoders.NAME] table of features inferred from a sample of these JSON "
        "lines or CSV files (.gz too), each choice with its reason, to paste into a config",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=SAMPLE_LINES,
        metavar="N",
        help="with --infer: lines read from each file (default: %(default)s)",
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        help="with --infer: the encoder's name (default: the first file's name before its dot)",
    )
    p.add_argument(
        "--csv-delimiter",
        default=",",
        metavar="CHAR",
        help="with --infer on CSV: the field delimiter (default: %(default)r)",
    )
    p.set_defaults(func=_schema)
