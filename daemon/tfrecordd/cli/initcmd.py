"""``tfrecordd init``: write a commented starter config that runs as written.

``tfrecordd init --source TYPE [--output FILE] [--dir BASE]`` writes a config for one source of
the chosen type (each source plugin that has a ``sample_config``: directory, tcp, redis-stream
among the built-ins), with every path under ``BASE`` (default: ``./tfrecordd-data``, made
absolute so the config runs from any working directory). It shows datasets: the source routes
each event by its ``type`` field to ``clicks`` (laid out by event hour, each finished hour marked
complete) or ``impressions`` (unpartitioned), each with its own small schema. The plugin's own
table reads the events of one encoder (``encoder = "events"``); that line becomes the route
(:func:`routed`). An existing file is never overwritten. ``--output -`` prints the config
instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrecordd.cli import help_of
from tfrecordd.endpoints import METRICS_LISTEN, split_host_port
from tfrecordd.errors import EXIT_OK, OutputError

if TYPE_CHECKING:
    from tfrecordd.plugin import Registry

__all__ = ["add_commands", "routed", "sample_event", "starter_config", "starter_sources"]

DEFAULT_BASE = "tfrecordd-data"
DEFAULT_OUTPUT = "tfrecordd.toml"
DEFAULT_METRICS = METRICS_LISTEN

ROUTE_TABLE = """\
[sources.route]                    # each event to the dataset its "type" names
field = "type"
to = { click = "clicks", impression = "impressions" }
"""
"""What a starter source's ``encoder = "events"`` becomes."""

_ENCODER_LINE = re.compile(r"""^encoder\s*=\s*["']events["'].*(?:\n|$)""", re.M)
_FEEDS = re.compile(r"^(?:dataset\s*=|route\s*=|\[sources\.route\])", re.M)


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


_TEMPLATE = """\
# tfrecordd starter config: a {source} source -> gzip TFRecord shards in two datasets under
#   {base}
# Each event goes by its "type" to "clicks" (in a folder per event hour, each finished hour
# marked complete) or to "impressions".
# Every key is described in docs/config-reference.md; datasets in docs/datasets.md.
# Check this file with
#   tfrecordd check-config {output}
# and run it with
#   tfrecordd run --config {output}

[daemon]
# node_id = "ingest-01"            # default: the host name; unique per output directory
# The journal, source positions and dead letters.
state_dir = {state}
drain_timeout = "30s"              # on SIGTERM: publish open shards within this, then exit

[metrics]
# /metrics for Prometheus, /healthz for liveness checks; loopback unless you choose else.
listen = {listen}

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


def starter_config(
    source: str,
    base: str | os.PathLike[str],
    *,
    output: str = DEFAULT_OUTPUT,
    listen: str = "",
    sample: str | None = None,
) -> str:
    """The starter config text for ``source`` (one of :func:`starter_sources`) with paths under
    ``base`` (made absolute): the plugin's own ``sample_config``, :func:`routed`, in a common
    frame; ``sample`` is the sample event it shows (default: :func:`sample_event`)."""
    model = _registry().sources.get(source)
    if model is None or not model.sample_config:
        raise ValueError(f"no starter config for source type {source!r}")
    root = Path(base).absolute()
    spool = root / "spool"
    sample = sample or sample_event()
    return _TEMPLATE.format(
        source=source,
        base=root,
        output=output,
        state=_toml_str(root / "state"),
        clicks=_toml_str(root / "shards" / "clicks"),
        impressions=_toml_str(root / "shards" / "impressions"),
        listen=_toml_str(listen or DEFAULT_METRICS),
        source_table=routed(model.sample_config.format(spool=_toml_str(spool), sample=sample)),
        sample=sample,
    )


def _toml_str(value: object) -> str:
    """A TOML basic string (JSON's escapes are a subset of TOML's)."""
    return json.dumps(str(value))


def _listen(text: str) -> str:
    try:
        split_host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _cmd_init(args: argparse.Namespace) -> int:
    output: str = args.output
    sample = sample_event()
    text = starter_config(
        args.source, args.dir, output=output, listen=args.metrics_listen, sample=sample
    )
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
    spool_dir = Path(args.dir).absolute() / "spool"
    print(f"wrote {output}: a {args.source} source, data under {Path(args.dir).absolute()}")
    print(f"  check it:  tfrecordd check-config {output}")
    print(f"  run it:    tfrecordd run --config {output}")
    try_it = _registry().sources[args.source].sample_try
    if try_it:
        print("  try it:    " + try_it.format(sample=sample, spool_dir=spool_dir))
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
        "--dir",
        default=DEFAULT_BASE,
        metavar="BASE",
        help="the base directory for the spool, state and shards (default: ./%(default)s)",
    )
    p.add_argument(
        "--metrics-listen",
        type=_listen,
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help="where the daemon serves /metrics and /healthz (default: %(default)s)",
    )
    p.set_defaults(func=_cmd_init)
