"""Declared schemas: decoded JSON events and CSV rows in, serialized Example / SequenceExample
bytes out.

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

CSV rows (:meth:`ExampleSchema.encode_csv`) are text, converted as
:mod:`tfrecordd.schema.csv_values` says.

Where the C extension is built, :func:`~tfrecordd.schema.plans.compile_json_plan` gives an
:class:`ExampleSchema` a compiled JSON path that writes the same bytes.

The modules, each with one job: :mod:`~tfrecordd.schema.specs` (declaring features),
:mod:`~tfrecordd.schema.paths` (where a value sits), :mod:`~tfrecordd.schema.numtext` (numbers and
timestamps from text), :mod:`~tfrecordd.schema.json_values` and
:mod:`~tfrecordd.schema.csv_values` (values converted), :mod:`~tfrecordd.schema.example` and
:mod:`~tfrecordd.schema.sequence` (the schemas), :mod:`~tfrecordd.schema.plans` (the compiled
plan).
"""

from tfrecordd.schema.example import CompiledFeature, ExampleSchema
from tfrecordd.schema.json_values import default_values
from tfrecordd.schema.paths import PathStep, parse_path
from tfrecordd.schema.plans import JsonPlan, StringGroups, compile_json_plan, string_groups
from tfrecordd.schema.sequence import SequenceSchema
from tfrecordd.schema.specs import FeatureSpec, TimeUnit, parse_feature

__all__ = [
    "CompiledFeature",
    "ExampleSchema",
    "FeatureSpec",
    "JsonPlan",
    "PathStep",
    "SequenceSchema",
    "StringGroups",
    "TimeUnit",
    "compile_json_plan",
    "default_values",
    "parse_feature",
    "parse_path",
    "string_groups",
]
