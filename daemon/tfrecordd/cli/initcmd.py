"""``tfrecordd init``: write a commented starter config that runs as written.

``tfrecordd init --source TYPE [--output FILE] [--dir BASE]`` writes a config for one source of
the chosen type (each source plugin that has a ``sample_config``: directory, tcp, redis-stream
among the built-ins), with every path under ``BASE`` (default: ``./tfrecordd-data``, made
absolute so the config runs from any working directory) and a small example schema. An existing
file is never overwritten. ``--output -`` prints the config instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrecordd.cli import help_of
from tfrecordd.endpoints import METRICS_LISTEN, split_host_port
from tfrecordd.errors import EXIT_OK, OutputError

if TYPE_CHECKING:
    from tfrecordd.plugin import Registry

__all__ = ["add_commands", "starter_config", "starter_sources"]

DEFAULT_BASE = "tfrecordd-data"
DEFAULT_OUTPUT = "tfrecordd.toml"
DEFAULT_METRICS = METRICS_LISTEN

_SAMPLE_EVENT = '{"id": 1, "text": "hello", "score": 0.5, "tags": ["a", "b"]}'


def starter_sources() -> tuple[str, ...]:
    """The installed source types that offer a starter config (``SourceConfig.sample_config``)."""
    return tuple(sorted(n for n, model in _registry().sources.items() if model.sample_config))


@cache
def _registry() -> Registry:
    # Imported here: the plugins are loaded only when a starter config is asked for.
    from tfrecordd.plugin import Registry

    return Registry.from_entry_points()


_TEMPLATE = """\
# tfrecordd starter config: a {source} source -> gzip TFRecord shards under {base}.
# Every key is described in docs/config-reference.md. Check this file with
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

[output]
# Shards appear here, each atomically and only once complete.
dir = {shards}
compression = "gzip"               # none | gzip | zlib (tf.data reads all three) | zstd
max_shard_bytes = "256MiB"         # on disk, compressed
max_shard_age = "10s"              # short, to see shards soon; "10m" or more in production

{source_table}
# An event such as
#   {sample}
# becomes one tf.train.Example with these features; a missing key is left out.
[encoders.events]
type = "example"
[encoders.events.features]
id = "int64"
text = "bytes"
score = "float"                    # written as float32
tags = "bytes"                     # a JSON list gives a list of values
"""


def starter_config(
    source: str, base: str | os.PathLike[str], *, output: str = DEFAULT_OUTPUT, listen: str = ""
) -> str:
    """The starter config text for ``source`` (one of :func:`starter_sources`) with paths under
    ``base`` (made absolute): the plugin's own ``sample_config`` in a common frame."""
    model = _registry().sources.get(source)
    if model is None or not model.sample_config:
        raise ValueError(f"no starter config for source type {source!r}")
    root = Path(base).absolute()
    spool = root / "spool"
    return _TEMPLATE.format(
        source=source,
        base=root,
        output=output,
        state=_toml_str(root / "state"),
        shards=_toml_str(root / "shards"),
        listen=_toml_str(listen or DEFAULT_METRICS),
        source_table=model.sample_config.format(spool=_toml_str(spool), sample=_SAMPLE_EVENT),
        sample=_SAMPLE_EVENT,
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
    text = starter_config(args.source, args.dir, output=output, listen=args.metrics_listen)
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
        print("  try it:    " + try_it.format(sample=_SAMPLE_EVENT, spool_dir=spool_dir))
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
