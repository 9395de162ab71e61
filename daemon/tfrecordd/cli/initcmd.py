"""``tfrecordd init``: write a commented starter config that runs as written.

``tfrecordd init --source TYPE [--format F] [--output FILE] [--dir BASE]`` writes a config for
one source of the chosen type (each source plugin that has a ``sample_config``: directory, tcp,
udp, unix, redis-stream among the built-ins; a directory's files as ``--format jsonl``, ``csv``
or ``images``), with every path under ``BASE`` (default: ``./tfrecordd-<kind>``, the kind being
the type and a directory's format other than jsonl, made absolute so the config runs from any
working directory) and its metrics on a port of the kind's own (:func:`metrics_listen`): two
starter configs of different kinds run side by side on one node. It shows datasets: the source
routes each event by its ``type`` field to ``clicks`` (laid out by event hour, each finished
hour marked complete) or ``impressions`` (unpartitioned), each with its own small schema. The
plugin's own table reads the events of one encoder (``encoder = "events"``); that line becomes
the route (:func:`routed`). A directory of images gets a config of its own: one dataset of
the ``image`` encoder, each image labelled by its class folder. An existing file is never
overwritten. ``--output -`` prints the config instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrecordd.cli import help_of
from tfrecordd.cli.datasetargs import UsageError
from tfrecordd.endpoints import METRICS_LISTEN, split_host_port
from tfrecordd.errors import EXIT_OK, OutputError
from tfrecordd.schema.infer_toml import toml_value

if TYPE_CHECKING:
    from tfrecordd.plugin import Registry

__all__ = [
    "FORMATS",
    "add_commands",
    "base_dir",
    "kind",
    "metrics_listen",
    "routed",
    "sample_event",
    "starter_config",
    "starter_sources",
]

DEFAULT_OUTPUT = "tfrecordd.toml"
DEFAULT_METRICS = METRICS_LISTEN
FORMATS = ("jsonl", "csv", "images")
"""What a starter ``directory`` source reads (``--format``)."""
_PORTS = 500
"""Starter kinds get metrics ports above the default one, in a range this wide."""

ROUTE_TABLE = """\
[sources.route]                    # each event to the dataset its "type" names
field = "type"
to = { click = "clicks", impression = "impressions" }
"""
"""What a starter source's ``encoder = "events"`` becomes."""

_ENCODER_LINE = re.compile(r"""^encoder\s*=\s*["']events["'].*(?:\n|$)""", re.M)
_FEEDS = re.compile(r"^(?:dataset\s*=|route\s*=|\[sources\.route\])", re.M)


def kind(source: str, fmt: str = "jsonl") -> str:
    """The starter kind of ``source`` reading ``fmt``: the type, and a directory's format when
    it is not the default (``directory-csv``)."""
    return source if fmt == "jsonl" else f"{source}-{fmt}"


def base_dir(source: str, fmt: str = "jsonl") -> str:
    """The default base directory of a starter config: ``tfrecordd-<kind>``."""
    return f"tfrecordd-{kind(source, fmt)}"


def metrics_listen(source: str, fmt: str = "jsonl") -> str:
    """The default metrics address of a starter config: loopback, on a port derived from its
    kind (the same for every init of that kind, other than other kinds' and than the daemon's
    default ``9464``), so starter configs of two kinds do not collide."""
    host, port = split_host_port(DEFAULT_METRICS)
    derived = int(port) + 1 + zlib.crc32(kind(source, fmt).encode()) % _PORTS
    return f"{host}:{derived}"


def sample_event(now: datetime | None = None) -> str:
    """The sample event of the starter config: a click, at ``now`` (default: the current time;
    an event of an hour long marked complete would be late)."""
    at = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {"type": "click", "ts": at, "user": "ada", "url": "https://example.com/", "position": 1}
    return json.dumps(event)


def routed(table: str) -> str:
    """A plugin's starter ``[[sources]]`` table with its ``encoder = "events"`` line taken out
    and :data:`ROUTE_TABLE` after it (unless the table names a dataset or a route itself)."""
    table = _ENCODER_LINE.sub("", table)
    if _FEEDS.search(table):
        return table
    return table.rstrip("\n") + "\n\n" + ROUTE_TABLE


def starter_sources() -> tuple[str, ...]:
    """The installed source types that offer a starter config (``SourceConfig.sample_config``)."""
    return tuple(sorted(n for n, model in _registry().sources.items() if model.sample_config))


@cache
def _registry() -> Registry:
    # Imported here: the plugins are loaded only when a starter config is asked for.
    from tfrecordd.plugin import Registry

    return Registry.from_entry_points()


_HEAD = """\
# Every key is described in docs/config-reference.md; datasets in docs/datasets.md.
# Check this file with
#   tfrecordd check-config {output}
# and run it with
#   tfrecordd run --config {output}

[daemon]
# node_id = "ingest-01"            # default: the host name; unique per output directory
# The journal, source positions and dead letters: one daemon per state_dir.
state_dir = {state}
drain_timeout = "30s"              # on SIGTERM: publish open shards within this, then exit

[metrics]
# /metrics for Prometheus, /healthz for liveness checks; loopback unless you choose else.
# The port is this kind of starter's own; any free one does.
listen = {listen}
"""

_TEMPLATE = """\
# tfrecordd starter config: a {source} source -> gzip TFRecord shards in two datasets under
#   {base}
# Each event goes by its "type" to "clicks" (in a folder per event hour, each finished hour
# marked complete) or to "impressions".
{head}
# A dataset is a schema (an [encoders.NAME] table) and its own shards: its records never share a
# shard with another dataset's. Shards appear atomically, and only once complete.
[datasets.clicks]
encoder = "clicks"
dir = {clicks}
compression = "gzip"               # none | gzip | zlib (tf.data reads all three) | zstd
max_shard_bytes = "256MiB"         # on disk, compressed
max_shard_age = "10s"              # short, to see shards soon; "10m" or more in production

[datasets.clicks.partition]
time = "event"                     # folders by the event's own time: dt=2026-11-25/hour=03/
time_field = "ts"
granularity = "hour"
zone = "UTC"                       # any IANA zone; daylight-saving changes lose no hour

[datasets.clicks.completion]
marker = "_SUCCESS"                # in each hour's folder once it can take no more events
allowed_lateness = "5m"            # how far behind the newest event time an event may come
idle_close = "5m"                  # no event for this long: hours close by the clock
late = "dead-letter"               # or "late-partition": kept under _late/dt=.../hour=.../

[datasets.impressions]
encoder = "impressions"
dir = {impressions}
compression = "gzip"
max_shard_age = "10s"

{source_table}
# An event such as
#   {sample}
# goes to the dataset its "type" names, as one tf.train.Example with that dataset's features
# (a missing key is left out); an event of any other type is dead-lettered.
[encoders.clicks]
type = "example"
[encoders.clicks.features]
ts = {{ type = "int64", time_unit = "ms", required = true }}  # RFC 3339, or epoch seconds
user = "bytes"
url = "bytes"
position = "int64"

[encoders.impressions]
type = "example"
[encoders.impressions.features]
ts = {{ type = "int64", time_unit = "ms" }}
user = "bytes"
slot = "int64"
ad = "bytes"
"""


_IMAGES_TEMPLATE = """\
# tfrecordd starter config: a directory of images -> TFRecord shards of tf.train.Examples
# (image/encoded, image/format, image/height, image/width, image/class/label...) under
#   {base}
# Each image is labelled by the folder it is in: {spool_dir}/cats/a.jpg is a "cats".
{head}
[datasets.images]
encoder = "images"
dir = {images}
compression = "none"               # images are compressed already; gzip would gain little
max_shard_bytes = "256MiB"         # on disk
max_shard_age = "10s"              # short, to see shards soon; "10m" or more in production

[[sources]]
name = "images"
type = "directory"
path = {spool}
# Producers copy an image elsewhere (or under a dotfile name), then rename it into its class
# folder: a name matching the pattern must be a finished file.
pattern = "*.jpg"                  # one glob; "*.png" for PNG files
format = "whole-file"              # one event per file, its folder's name as its label
recursive = true                   # read the class folders: cats/, dogs/...
dataset = "images"
on_done = "delete"                 # or "move": into done/ inside the spool, once published

[encoders.images]
type = "image"
# The class folder's name -> image/class/label; an image in another folder is dead-lettered.
labels = {{ cats = 0, dogs = 1 }}
"""


def starter_config(
    source: str,
    base: str | os.PathLike[str],
    *,
    output: str = DEFAULT_OUTPUT,
    listen: str = "",
    sample: str | None = None,
    fmt: str = "jsonl",
) -> str:
    """The starter config text for ``source`` (one of :func:`starter_sources`) with paths under
    ``base`` (made absolute): the plugin's own ``sample_config``, :func:`routed`, in a common
    frame; ``sample`` is the sample event it shows (default: :func:`sample_event`); ``fmt``
    what a ``directory`` source reads (one of :data:`FORMATS`)."""
    model = _registry().sources.get(source)
    if model is None or not model.sample_config:
        raise ValueError(f"no starter config for source type {source!r}")
    if fmt not in FORMATS or (fmt != "jsonl" and source != "directory"):
        raise ValueError(f"no starter config for {source!r} reading {fmt!r}")
    root = Path(base).absolute()
    spool = root / "spool"
    sample = sample or sample_event()
    head = _HEAD.format(
        output=output,
        state=_toml_str(root / "state"),
        listen=_toml_str(listen or metrics_listen(source, fmt)),
    )
    if fmt == "images":
        return _IMAGES_TEMPLATE.format(
            base=root,
            head=head,
            spool_dir=spool,
            spool=_toml_str(spool),
            images=_toml_str(root / "shards" / "images"),
        )
    table = model.sample_config.format(
        spool=_toml_str(spool), socket=_toml_str(root / "tfrecordd.sock"), sample=sample
    )
    if fmt == "csv":
        table = _as_csv(table)
    return _TEMPLATE.format(
        source=source if fmt == "jsonl" else f"{source} ({fmt})",
        base=root,
        head=head,
        clicks=_toml_str(root / "shards" / "clicks"),
        impressions=_toml_str(root / "shards" / "impressions"),
        source_table=routed(table),
        sample=sample,
    )


_CSV_COLUMNS = ("type", "ts", "user", "url", "position")
"""The sample event's fields, as the header row of the starter's CSV files."""


def _as_csv(table: str) -> str:
    """The ``directory`` source's starter table reading CSV files instead of JSON lines."""
    table, n = re.subn(r'^pattern = "\*\.jsonl"', 'pattern = "*.csv"', table, flags=re.M)
    table, m = re.subn(
        r'^format = "jsonl".*$',
        'format = "csv"                     # a header row, then one event per record',
        table,
        flags=re.M,
    )
    if (n, m) != (1, 1):  # pragma: no cover - the directory plugin's table changed
        raise ValueError("the directory source's starter table has no jsonl pattern and format")
    return table


def _csv_sample(sample: str) -> str:
    """The sample event as a CSV file: a header row and one record (printf's escapes)."""
    event = json.loads(sample)
    return ",".join(_CSV_COLUMNS) + "\\n" + ",".join(str(event[c]) for c in _CSV_COLUMNS) + "\\n"


def _try_line(source: str, fmt: str, sample: str, base: Path) -> str:
    """The shell command that feeds the starter config one event (``""``: none offered)."""
    spool_dir = base / "spool"
    if fmt == "csv":
        tmp, name = spool_dir / ".first.tmp", spool_dir / "first.csv"
        return f"printf '{_csv_sample(sample)}' > {tmp} && mv {tmp} {name}"
    if fmt == "images":
        folder = spool_dir / "cats"
        return (
            f"mkdir -p {folder} && cp YOUR.jpg {folder}/.first.tmp && "
            f"mv {folder}/.first.tmp {folder}/first.jpg"
        )
    try_it = _registry().sources[source].sample_try
    return try_it.format(sample=sample, spool_dir=spool_dir, socket=base / "tfrecordd.sock")


def _toml_str(value: object) -> str:
    """A TOML string value that loads back as ``value`` (each ``$`` written ``$$``)."""
    return toml_value(str(value))


def _listen(text: str) -> str:
    try:
        split_host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _cmd_init(args: argparse.Namespace) -> int:
    output: str = args.output
    fmt: str = args.format
    if fmt != "jsonl" and args.source != "directory":
        raise UsageError(
            f"--format {fmt} is for --source directory (a {args.source} source reads JSON events)"
        )
    base = Path(args.dir or base_dir(args.source, fmt)).absolute()
    sample = sample_event()
    listen = args.metrics_listen or metrics_listen(args.source, fmt)
    text = starter_config(args.source, base, output=output, listen=listen, sample=sample, fmt=fmt)
    if output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise OutputError(output, "exists already; refusing to overwrite") from None
    except OSError as e:
        raise OutputError(output, f"cannot create: {e.strerror or e}") from e
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    if args.source == "directory":
        # Made now: producers may drop files before the first run, and the daemon's start does
        # not warn of a spool that is not there (which reads as a mistyped path).
        (base / "spool").mkdir(parents=True, exist_ok=True)
    what = args.source if fmt == "jsonl" else f"{args.source} ({fmt})"
    print(f"wrote {output}: a {what} source, data under {base}, metrics on {listen}")
    print(f"  check it:  tfrecordd check-config {output}")
    print(f"  run it:    tfrecordd run --config {output}")
    try_it = _try_line(args.source, fmt, sample, base)
    if try_it:
        print("  try it:    " + try_it)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register ``init`` on the CLI's subparsers."""
    help_text = help_of("init")
    p = sub.add_parser("init", help=help_text, description=help_text)
    p.add_argument(
        "--source", required=True, choices=starter_sources(), help="the kind of source to read"
    )
    p.add_argument(
        "--output",
        "-o",
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help="where to write the config, never overwritten; - for stdout (default: %(default)s)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="jsonl",
        help="what a directory source reads: JSON lines, CSV files, or images in class folders "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--dir",
        metavar="BASE",
        help="the base directory for the spool, state and shards (default: ./tfrecordd-KIND, "
        "KIND the source type, and the format if not jsonl: ./tfrecordd-directory-csv)",
    )
    p.add_argument(
        "--metrics-listen",
        type=_listen,
        metavar="HOST:PORT",
        help="where the daemon serves /metrics and /healthz (default: loopback, on a port of "
        "the starter kind's own above 9464, so two kinds run side by side)",
    )
    p.set_defaults(func=_cmd_init)
