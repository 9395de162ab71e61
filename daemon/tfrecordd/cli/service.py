"""The service commands: ``run``, ``check-config`` and ``plugins``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import anyio

from tfrecordd import heap, logs, secretvalues, speedups, startcheck
from tfrecordd.cli import help_of
from tfrecordd.config import DaemonConfig, load_config
from tfrecordd.datasets import PartitionSection
from tfrecordd.errors import (
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    ListenError,
    TfrecorddError,
    find_error,
)
from tfrecordd.fsys import LOCAL
from tfrecordd.outputs import make_output
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import Registry
from tfrecordd.showconfig import effective, to_toml

log = logging.getLogger("tfrecordd")


def add_commands(sub: Any) -> None:
    """Register the service subcommands on the CLI's subparsers."""
    p = sub.add_parser("run", help=help_of("run"))
    p.add_argument("--config", "-c", required=True, help="the TOML config file")
    p.add_argument(
        "--log-format", choices=["auto", "text", "json"], help="override [daemon].log_format"
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines written; overrides [daemon].log_level (default: info)",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check-config", help=help_of("check-config"))
    p.add_argument("config", nargs="?", help="the TOML config file (or --config)")
    p.add_argument("--config", "-c", dest="config_option", metavar="FILE", help="the config file")
    p.add_argument(
        "--config-only",
        action="store_true",
        help="check the config alone, not this machine (folders, ports): to validate a "
        "config elsewhere than where it runs",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="print the config in effect (defaults filled in, ${...} substituted) as TOML, "
        "every secret masked",
    )
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("plugins", help=help_of("plugins"))
    p.set_defaults(func=cmd_plugins)


def cmd_run(args: argparse.Namespace) -> int:
    """Validate the config, then run the daemon until SIGTERM/SIGINT."""
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"tfrecordd: {e}", file=sys.stderr)
        return e.exit_code
    level = args.log_level or config.daemon.log_level
    logs.setup(args.log_format or config.daemon.log_format, getattr(logging, level.upper()))
    for handler in logging.getLogger().handlers:
        handler.addFilter(secretvalues.MaskingFilter())
    for warning in startcheck.missing_inputs(config):
        log.warning("%s", warning)
    if problems := startcheck.path_problems(config):
        for problem in problems:
            log.error("cannot start: %s", problem)
        return problems[0].exit_code
    heap.tune()
    daemon = Daemon(config)
    try:
        anyio.run(daemon.run)
    except (TfrecorddError, BaseExceptionGroup, OSError) as e:
        error = find_error(e)
        if error is None:
            if (explained := startcheck.explain(e, config)) is None:
                raise
            log.error("stopping: %s", explained)
            return explained.exit_code
        key = (
            startcheck.listen_key(config, error.address) if isinstance(error, ListenError) else None
        )
        log.error("stopping: %s%s", f"{key}: " if key else "", error)
        return error.exit_code
    log.info("stopped")
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    """Run the start-up checks on a config file; print a summary (or, with ``--show``, the
    config in effect) or every error."""
    path = args.config_option or args.config
    if path is None or (args.config_option and args.config):
        print(
            "tfrecordd check-config: give one config file (FILE or --config FILE)", file=sys.stderr
        )
        return EXIT_USAGE
    args.config = path
    config = load_config(path)
    if args.show:
        sys.stdout.write(to_toml(effective(config)))
        return EXIT_OK
    problems = [] if args.config_only else startcheck.path_problems(config)
    if problems:
        # valid, but run would stop at once: no "OK" for it
        for problem in problems:
            print(f"tfrecordd: {problem}", file=sys.stderr)
        return problems[0].exit_code
    print(
        f"{args.config}: OK ({len(config.sources)} source(s), {len(config.encoders)} encoder(s), "
        f"{len(config.datasets)} dataset(s))"
    )
    for name, d in config.datasets.items():
        output = make_output(config, LOCAL, dataset=name).redact()
        parts = [f"encoder {d.encoder}", f"output {output['location']}", str(d.compression)]
        if d.partition.partitioned:
            parts.append(f"partitioned by {_partitioning(d.partition)}")
        if d.completion is not None:
            parts.append(f"completion marker {d.completion.marker}")
        print(f"  dataset {name}: {', '.join(parts)}")
        for key, value in output.items():
            if key != "location":
                print(f"    output {key}: {value}")
    for s in config.sources:
        if s.route is not None:
            feeds = f"routes by {s.route.field!r} to {', '.join(config.fed_datasets(s))}"
        else:
            feeds = f"dataset {config.fed_datasets(s)[0]}"
        print(f"  source {s.name}: type {s.type}, {feeds}, {type(s).delivery}")
    if not args.config_only:
        _warn(config)
    return EXIT_OK


def _warn(config: DaemonConfig) -> None:
    """What ``run`` would meet on this machine now without stopping: a spool that does not
    exist, a listen address another process holds now."""
    from tfrecordd.state import statelock

    warnings = startcheck.missing_inputs(config)
    pid = statelock.holder(str(config.daemon.state_dir))
    if pid is None:
        warnings += [f"{p} (run would exit {p.exit_code})" for p in startcheck.busy_ports(config)]
    else:
        # Its listen addresses are its own: a reload keeps them, and they are not in use by
        # "another process".
        running = f"the daemon (PID {pid})" if pid else "a daemon"
        print(f"note: {running} runs on this state_dir: its listen addresses are not checked")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List every registered plugin with where it comes from."""
    del args
    reg = Registry.from_entry_points()
    print("sources:")
    for name, model in sorted(reg.sources.items()):
        delivery = getattr(model, "delivery", "?")
        print(f"  {name:<16} {model.__module__}.{model.__qualname__}  ({delivery})")
    print("encoders:")
    for name, emodel in sorted(reg.encoders.items()):
        print(f"  {name:<16} {emodel.__module__}.{emodel.__qualname__}")
    print("compiled hot path:")
    for name, used in speedups.status().items():
        why = (
            "in use"
            if used
            else "off (TFRECORDD_PURE_PYTHON)"
            if speedups.PURE_PYTHON
            else "not built"
        )
        print(f"  tfrecordd.{name:<14} {why}")
    if reg.broken:
        print("failed to load:")
        for name, error in sorted(reg.broken.items()):
            print(f"  {name}: {error}")
    return EXIT_OK


def _partitioning(p: PartitionSection) -> str:
    what = []
    if p.time != "none":
        source = f"event time ({p.time_field})" if p.time == "event" else "arrival time"
        what.append(f"{source} per {p.granularity} in {p.zone}")
    what += [f"field {f}" for f in p.fields]
    return " and ".join(what)
