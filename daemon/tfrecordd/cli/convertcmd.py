"""``tfrecordd convert --config FILE [--dataset NAME] INPUT... [--out DIR|URL]``: files of JSON
lines, CSV or images into a dataset's shards, in one run and without a daemon (see
:mod:`tfrecordd.convert` and docs/convert.md).

The summary goes to stderr (and as JSON to stdout with ``--json``). The exit status is 0, or
:data:`~tfrecordd.convert.EXIT_DEAD_LETTERS` (65) when records were dead-lettered, unless
``--allow-dead-letters``; the other statuses are the table's (66 a missing input, 73 an output
holding another conversion, 74 an I/O error, 75 another conversion into the same output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.cli.datasetargs import UsageError, add_dataset_options, choose_dataset
from tfrecordd.errors import EXIT_OK, DurabilityError
from tfrecordd.format.compress import Compressor
from tfrecordd.format.compression import Compression
from tfrecordd.units import parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return n


def default_workers() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def min_shard_bytes() -> int:
    """The smallest ``--shard-size``: the config's least ``max_shard_bytes``."""
    from tfrecordd.datasets import OutputSection

    for rule in OutputSection.model_fields["max_shard_bytes"].metadata:
        least = getattr(rule, "ge", None)  # the field's `ge=` bound
        if isinstance(least, int):
            return least
    raise AssertionError("max_shard_bytes has no least value")


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _convert(args: argparse.Namespace) -> int:
    from tfrecordd.config import load_config
    from tfrecordd.convert import EXIT_DEAD_LETTERS, Run, plan_conversion
    from tfrecordd.convert.meter import Meter, human_size

    config = load_config(args.config)
    dataset = choose_dataset(config, args.config, args.dataset)
    if args.level is not None and args.compression is None:
        raise UsageError("--level needs --compression (the config's level goes with its own)")
    smallest = min_shard_bytes()
    if args.shard_size is not None and args.shard_size < smallest:
        raise UsageError(
            f"--shard-size {args.shard_size}: at least {smallest} bytes (as max_shard_bytes)"
        )
    compression = Compression(args.compression) if args.compression else None
    if compression is not None and args.level is not None:
        # Checked before the conversion starts: a level a worker refuses would be saved with
        # the run's state, and a rerun with a good level then refused as other arguments.
        try:
            Compressor(compression, args.level)
        except ValueError as e:
            raise UsageError(f"--level {args.level}: {e}") from None
    plan = plan_conversion(
        config,
        dataset,
        args.inputs,
        out=args.out,
        shard_bytes=args.shard_size,
        shards=args.shards,
        compression=compression,
        level=args.level,
        fmt=args.format,
        workers=args.workers,
    )
    total = sum(f.size for f in plan.files)
    meter = None if args.quiet else Meter(total, interval=args.progress_interval)
    run = Run(plan, meter)
    try:
        summary = run.run()
    except KeyboardInterrupt:
        if meter is not None:
            meter.close()
        print("convert: interrupted; the same command again resumes it", file=sys.stderr)
        raise
    except OSError as e:
        # A full disk or a vanished folder: one line and the I/O status, and a rerun resumes.
        where = e.filename or plan.directory
        raise DurabilityError(f"{where}: {e.strerror or e}; run again to resume") from e
    finally:
        if meter is not None:
            meter.close()
    rate = summary.run_records / summary.seconds if summary.seconds > 0 else 0.0
    line = (
        f"convert: {_plural(summary.records, 'record')} from {_plural(len(plan.files), 'file')} "
        f"({human_size(summary.input_bytes)}) into {_plural(summary.shards, 'shard')} "
        f"({human_size(summary.shard_bytes)}) in {plan.directory}; "
        f"{_plural(summary.dead_letters, 'dead letter')}"
    )
    if summary.dead_letters:
        line += f" in {summary.dead_letter_path}"
    line += f"; {summary.seconds:.1f} s, {rate:,.0f} records/s"
    if summary.resumed:
        line += " (resumed)"
    print(line, file=sys.stderr)
    if args.json:
        doc: dict[str, Any] = {
            "records": summary.records,
            "dead_letters": summary.dead_letters,
            "shards": summary.shards,
            "shard_bytes": summary.shard_bytes,
            "input_bytes": summary.input_bytes,
            "input_files": len(plan.files),
            "seconds": round(summary.seconds, 3),
            "records_per_second": round(rate, 1),
            "resumed": summary.resumed,
            "output": summary.directory,
            "dead_letter_file": summary.dead_letter_path,
        }
        print(json.dumps(doc))
    if summary.dead_letters and not args.allow_dead_letters:
        print(
            f"convert: exit {EXIT_DEAD_LETTERS}: {_plural(summary.dead_letters, 'record')} "
            "dead-lettered (--allow-dead-letters to exit 0 all the same)",
            file=sys.stderr,
        )
        return EXIT_DEAD_LETTERS
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Add ``convert`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "convert",
        help=help_of("convert"),
        description=(
            "Convert files of JSON lines, CSV or images into a dataset's TFRecord shards, with "
            "its encoder, in one run on every core. Deterministic (the same inputs and "
            "arguments give the same shards, byte for byte) and resumable: run it again with "
            "the same arguments after a kill, and it goes on where it stopped. Exit 65 when "
            "records were dead-lettered, unless --allow-dead-letters."
        ),
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="files, or directories (every file under them, recursively, in name order)",
    )
    add_dataset_options(p, config_required=True)
    p.add_argument(
        "--out",
        metavar="DIR|URL",
        help="the output directory (made if missing) or an object store URL "
        "(default: the dataset's own dir)",
    )
    count = p.add_mutually_exclusive_group()
    count.add_argument(
        "--shard-size",
        type=_size,
        metavar="SIZE",
        help="cut a shard when the next batch would take it past SIZE, e.g. 256MiB "
        "(default: the dataset's max_shard_bytes)",
    )
    count.add_argument(
        "--shards",
        type=_positive,
        metavar="N",
        help="exactly N shards, of about equal input bytes, named <prefix>-00000-of-0000N",
    )
    p.add_argument(
        "--compression",
        choices=[c.value for c in Compression],
        help="the shards' compression (default: the dataset's)",
    )
    p.add_argument("--level", type=int, help="compression level (with --compression)")
    p.add_argument(
        "--format",
        choices=["jsonl", "csv", "whole-file"],
        help="how every input is read (default: as the directory source feeding the dataset "
        "reads, else by name: .csv/.tsv CSV, image suffixes whole files, others JSON lines)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=default_workers(),
        metavar="N",
        help="encode processes (default: every core, here %(default)s)",
    )
    p.add_argument(
        "--allow-dead-letters",
        action="store_true",
        help="exit 0 even when records were dead-lettered",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="off a terminal, a progress line every SECONDS (default: 10)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress, only the summary")
    p.add_argument("--json", action="store_true", help="also print the summary as JSON on stdout")
    p.set_defaults(func=_convert)
