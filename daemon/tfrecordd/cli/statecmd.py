"""``tfrecordd state``: check and repair the daemon's state (journal and checkpoint) while it is
stopped, and move a source's committed positions to a new name.

``check`` reads ``state_dir`` without changing anything and says whether the daemon would start
on it: exit 0 if so, 65 if a file is damaged, 78 if the state belongs to sources the config no
longer has, 75 if a daemon runs on it now (named by its PID: a second one cannot start).
``repair`` cuts a torn journal tail, rebuilds a damaged journal from every sound
record in it (the damaged file is kept beside it), and, only with ``--discard-checkpoint``,
sets a damaged checkpoint aside: the positions it held are then lost, and half-read inputs are
read again from their start. ``rename-source OLD NEW`` moves OLD's positions (checkpoint,
journal, ``sources/OLD``) to NEW; ``forget-source NAME`` drops them (its half-read inputs will
be read from their start if it is configured again).

Every command but ``check`` refuses to run while a daemon holds ``state_dir/lock``.

The commands that write are atomic: each makes its files aside and commits them at once as one
:class:`~tfrecordd.state.change.Change` (``state_dir/change.json``). Killed at any point, a
command has changed nothing, or its change is committed: then the next ``state`` command, or
the daemon's start, finishes it, and ``check`` reads the state as it will be. A command rerun
after a kill gives what an uninterrupted run gives.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import orjson

from tfrecordd import crashpoints
from tfrecordd.cli import help_of
from tfrecordd.config import load_config
from tfrecordd.errors import (
    EXIT_CONFIG,
    EXIT_DATA,
    EXIT_IN_USE,
    EXIT_OK,
    ConfigError,
    StateError,
    StateFormatError,
)
from tfrecordd.format.framing import frame
from tfrecordd.fsys import is_url, local_path
from tfrecordd.outputs.shards import staged_path, staging_dir
from tfrecordd.state import change, statelock
from tfrecordd.state.journal import check_sources
from tfrecordd.state.reading import Scan, read_checkpoint, scan_journal
from tfrecordd.state.records import (
    CHECKPOINT,
    JOURNAL,
    Checkpoint,
    Intent,
    ShardRef,
    newer_format_error,
)


@contextlib.contextmanager
def _exclusive(state_dir: str) -> Iterator[None]:
    """Hold the daemon's lock on ``state_dir`` while the command changes it: no daemon runs on
    it now (:class:`~tfrecordd.errors.StateInUseError`, exit 75) and none starts meanwhile."""
    crashpoints.check_armed(crashpoints.STATE_POINTS)
    if not os.path.isdir(state_dir):
        yield
        return
    fd = statelock.acquire(state_dir)
    try:
        yield
    finally:
        os.close(fd)


_Outputs = dict[str, tuple[str, str] | None]
"""Per dataset, its local output directory and this node's staging folder in it (``None`` for
an object store)."""


def _state_dir(args: argparse.Namespace) -> tuple[str, dict[str, str], _Outputs]:
    """``state_dir``, the configured sources' types, and the datasets' outputs."""
    config = load_config(args.config)
    where: _Outputs = {}
    for name, d in config.datasets.items():
        local = None if is_url(d.dir) else local_path(d.dir)
        where[name] = None if local is None else (local, staging_dir(local, config.daemon.node_id))
    return str(config.daemon.state_dir), {s.name: s.type for s in config.sources}, where


def _intents(records: list[dict[str, Any]]) -> tuple[list[Intent], list[Intent]]:
    """Finished and unfinished intents of a journal's records."""
    intents: dict[int, Intent] = {}
    ended: dict[int, bool] = {}
    for rec in records:
        if rec["t"] == "intent":
            intents[int(rec["seq"])] = Intent.from_json(rec)
        elif rec["t"] == "done":
            ended[int(rec["seq"])] = bool(rec.get("dropped"))
    finished = [intents[s] for s in sorted(intents) if ended.get(s) is False]
    unfinished = [intents[s] for s in sorted(intents) if s not in ended]
    return finished, unfinished


def _types(records: list[dict[str, Any]], ckpt: Checkpoint) -> dict[str, str]:
    types = dict(ckpt.types)
    for rec in records:
        if rec["t"] == "sources":
            types.update(rec["types"])
    return types


def _shard_state(outputs: _Outputs, ref: ShardRef) -> str:
    if ref.dataset not in outputs and not (ref.dataset == "" and len(outputs) == 1):
        return f"dataset {ref.dataset!r} is not configured"
    out = outputs.get(ref.dataset) or next(iter(outputs.values()))
    if out is None:
        return "remote output: decided at start"
    directory, staging = out
    if os.path.lexists(os.path.join(directory, ref.name)):
        return "published"
    if os.path.lexists(staged_path(staging, directory, os.path.basename(ref.name))):
        return "in progress: published at start"
    return "published and moved away"


def _intent_state(outputs: _Outputs, intent: Intent) -> str:
    if not intent.shards:
        return "positions only; its acks are redone at start"
    shards = "; ".join(f"{ref.name}: {_shard_state(outputs, ref)}" for ref in intent.shards)
    return f"{shards}; its acks are redone at start"


def cmd_check(args: argparse.Namespace) -> int:
    """Say whether the daemon would start on its state, and why not."""
    state_dir, configured, out = _state_dir(args)
    ckpt_path = os.path.join(state_dir, CHECKPOINT)
    journal_path = os.path.join(state_dir, JOURNAL)
    code = EXIT_OK
    in_use = _in_use(state_dir)
    if in_use:
        print(f"{state_dir}: {in_use}; below is its state as it stands now, while it changes")
    try:
        pending = change.pending(state_dir) if os.path.isdir(state_dir) else None
    except StateError as e:
        print(f"{e.path}: {e.detail}")
        return EXIT_DATA
    if pending is not None:
        print(
            f"{os.path.join(state_dir, change.MARKER)}: `{pending.text}` was interrupted after "
            "its change was committed: the next start (or a rerun) finishes it; the state "
            "below is as it leaves it"
        )
    ckpt_file = ckpt_path if pending is None else pending.view(state_dir, CHECKPOINT)
    journal_file = journal_path if pending is None else pending.view(state_dir, JOURNAL)
    try:
        ckpt = None if ckpt_file is None else read_checkpoint(ckpt_file)
        print(f"{ckpt_path}: " + ("absent" if ckpt is None else "OK"))
    except StateFormatError as e:
        print(f"{ckpt_path}: {e.detail}")
        return EXIT_DATA
    except StateError as e:
        print(f"{ckpt_path}: DAMAGED: {e.detail}")
        print("  repair: `tfrecordd state repair --discard-checkpoint` (its positions are lost)")
        ckpt, code = None, EXIT_DATA
    try:
        scan = Scan([], 0, 0) if journal_file is None else scan_journal(journal_file)
    except StateError as e:
        print(f"{journal_path}: {e.detail}")
        return EXIT_DATA
    if scan.newer is not None:
        print(f"{journal_path}: {newer_format_error(journal_path, scan.newer).detail}")
        return EXIT_DATA
    finished, unfinished = _intents(scan.records)
    print(
        f"{journal_path}: {len(scan.records)} sound record(s), {scan.good_end} of {scan.size} "
        f"bytes; {len(finished)} finished commit(s), {len(unfinished)} unfinished"
    )
    if scan.damage is not None:
        d = scan.damage
        print(
            f"  DAMAGED at byte {d.offset} ({d.detail}); {d.intents_after} sound intent(s) "
            f"and {d.drops_after} drop(s) after it: `tfrecordd state repair` rebuilds it from "
            "every sound record"
        )
        code = EXIT_DATA
    elif scan.torn:
        print(f"  torn tail at byte {scan.good_end}: harmless, cut off at the next start")
    for intent in unfinished:
        print(f"  unfinished commit {intent.seq}: {_intent_state(out, intent)}")
    if ckpt is not None or code == EXIT_OK:
        try:
            check_sources(
                journal_path,
                configured,
                ckpt or Checkpoint(),
                finished,
                unfinished,
                _types(scan.records, ckpt or Checkpoint()),
            )
        except ConfigError as e:
            for line in e.errors:
                print(f"  {line}")
            code = code or EXIT_CONFIG
    if in_use:
        print(f"IN USE: {in_use}: another daemon cannot start on this state_dir until it stops")
        return EXIT_IN_USE
    print("OK: the daemon can start on this state" if code == EXIT_OK else "NOT OK")
    return code


def _in_use(state_dir: str) -> str:
    """Who runs on ``state_dir`` now (``"in use by tfrecordd pid N"``), or ``""``."""
    if not os.path.isdir(state_dir):
        return ""
    pid = statelock.holder(state_dir)
    if pid is None:
        return ""
    return f"in use by tfrecordd pid {pid}" if pid else "in use by a running tfrecordd"


def _journal(records: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(orjson.dumps(r)) for r in records)


def _aside(state_dir: str, name: str) -> str:
    """A name to keep the damaged file ``name`` under, not taken yet."""
    stem = f"{name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    aside, n = stem, 1
    while os.path.lexists(os.path.join(state_dir, aside)):
        n += 1
        aside = f"{stem}-{n}"
    return aside


def _finish_interrupted(state_dir: str, command: list[str]) -> bool:
    """Finish a change an interrupted ``state`` command committed; whether it was ``command``'s
    (then this run has nothing left to do)."""
    done = change.finish(state_dir)
    if done is None:
        return False
    print(f"{state_dir}: finished the interrupted `{done.text}`")
    return done.command == command


def cmd_repair(args: argparse.Namespace) -> int:
    """Cut a torn tail, rebuild a damaged journal, set a damaged checkpoint aside if asked."""
    state_dir, _, _ = _state_dir(args)
    ckpt_path = os.path.join(state_dir, CHECKPOINT)
    journal_path = os.path.join(state_dir, JOURNAL)
    command = ["repair", *(["--discard-checkpoint"] if args.discard_checkpoint else [])]
    with _exclusive(state_dir):
        if _finish_interrupted(state_dir, command):
            return EXIT_OK
        repair = change.Change(command)
        said: list[str] = []
        try:
            read_checkpoint(ckpt_path)
        except StateFormatError:
            raise  # a newer version's state: never set aside by this one
        except StateError as e:
            if not args.discard_checkpoint:
                print(
                    f"{ckpt_path}: damaged ({e.detail}); rerun with --discard-checkpoint to set "
                    "it aside: the positions it held are lost, and inputs read in part are read "
                    "again from their start (their events are written twice)"
                )
                return EXIT_DATA
            aside = _aside(state_dir, CHECKPOINT)
            repair.rename(CHECKPOINT, aside)
            said.append(f"{ckpt_path}: damaged; set aside as {os.path.join(state_dir, aside)}")
        scan = scan_journal(journal_path)
        if scan.newer is not None:
            raise newer_format_error(journal_path, scan.newer)
        if scan.damage is not None:
            kept = scan.records + scan.salvage
            aside = _aside(state_dir, JOURNAL)
            repair.link(JOURNAL, aside)
            repair.write(JOURNAL, _journal(kept))
            said.append(
                f"{journal_path}: rebuilt from {len(kept)} sound record(s) (the damaged record "
                f"at byte {scan.damage.offset} is left out); the damaged file is kept as "
                f"{os.path.join(state_dir, aside)}"
            )
        elif scan.torn:
            repair.write(JOURNAL, _journal(scan.records))
            said.append(f"{journal_path}: torn tail at byte {scan.good_end} cut off")
        else:
            said.append(f"{journal_path}: sound, nothing to repair")
        repair.apply(state_dir)
        print("\n".join(said))
    return EXIT_OK


def _rename_in(value: dict[str, Any], old: str, new: str | None) -> None:
    if old in value:
        moved = value.pop(old)
        if new is not None:
            value[new] = moved


def _holders(ckpt: Checkpoint | None, records: list[dict[str, Any]]) -> set[str]:
    """The sources with anything in the checkpoint or the journal."""
    held = set(ckpt.sources) | set(ckpt.types) | set(ckpt.unfolded) if ckpt is not None else set()
    for rec in records:
        if rec["t"] == "intent":
            held.update(rec["positions"])
        elif rec["t"] == "sources":
            held.update(rec["types"])
    return held


def _rewrite_source(state_dir: str, command: list[str], old: str, new: str | None) -> bool:
    """Move (or, with ``new`` ``None``, drop) ``old``'s state everywhere it is kept, as one
    change; ``False`` if ``old`` has none (nothing is changed)."""
    ckpt_path = os.path.join(state_dir, CHECKPOINT)
    journal_path = os.path.join(state_dir, JOURNAL)
    ckpt = read_checkpoint(ckpt_path)
    scan = scan_journal(journal_path)
    if scan.newer is not None:
        raise newer_format_error(journal_path, scan.newer)
    if scan.damage is not None:
        raise StateError(journal_path, "is damaged", "run `state repair`")
    own, new_own = f"sources/{old}", f"sources/{new}"
    # A forgotten source's own folder stays (as its name's files outside the journal do); an
    # empty one (the daemon makes one for every source) is no state to move.
    own_path = os.path.join(state_dir, own)
    has_own = new is not None and os.path.isdir(own_path) and _not_empty(own_path)
    if old not in _holders(ckpt, scan.records) and not has_own:
        return False
    if new is not None:
        finished, unfinished = _intents(scan.records)
        positions = set(ckpt.sources) | set(ckpt.unfolded) if ckpt is not None else set()
        for intent in [*finished, *unfinished]:
            positions.update(intent.positions)
        taken = os.path.join(state_dir, new_own)
        if new in positions or (has_own and os.path.lexists(taken) and _not_empty(taken)):
            raise ConfigError([f"state rename-source: {new!r} already has state of its own"])
    for rec in scan.records:
        if rec["t"] == "intent":
            _rename_in(rec["positions"], old, new)
        elif rec["t"] == "sources":
            _rename_in(rec["types"], old, new)
    rewrite = change.Change(command)
    if ckpt is not None:
        for part in (ckpt.sources, ckpt.types, ckpt.unfolded):
            _rename_in(part, old, new)
        rewrite.write(CHECKPOINT, orjson.dumps(ckpt.to_json()))
    rewrite.write(JOURNAL, _journal(scan.records))
    if has_own:
        rewrite.rename(own, new_own)
    rewrite.apply(state_dir)
    return True


def _not_empty(path: str) -> bool:
    if not os.path.isdir(path) or os.path.islink(path):
        return True
    with os.scandir(path) as entries:
        return any(True for _ in entries)


def cmd_rename_source(args: argparse.Namespace) -> int:
    """Give source OLD's committed positions to NEW."""
    state_dir, _, _ = _state_dir(args)
    command = ["rename-source", args.old, args.new]
    with _exclusive(state_dir):
        if not _finish_interrupted(state_dir, command) and not _rewrite_source(
            state_dir, command, args.old, args.new
        ):
            print(f"{state_dir}: source {args.old!r} has no state: nothing to move")
            return EXIT_OK
    print(f"{state_dir}: the positions of source {args.old!r} are now {args.new!r}'s")
    return EXIT_OK


def cmd_forget_source(args: argparse.Namespace) -> int:
    """Drop source NAME's committed positions."""
    state_dir, configured, _ = _state_dir(args)
    if args.name in configured:
        raise ConfigError([f"state forget-source: {args.name!r} is still configured"])
    command = ["forget-source", args.name]
    with _exclusive(state_dir):
        if not _finish_interrupted(state_dir, command) and not _rewrite_source(
            state_dir, command, args.name, None
        ):
            print(f"{state_dir}: source {args.name!r} has no state: nothing to forget")
            return EXIT_OK
    print(f"{state_dir}: the positions of source {args.name!r} are forgotten")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register ``state check|repair|rename-source|forget-source`` on the CLI's subparsers."""
    help_text = help_of("state")
    state = sub.add_parser("state", help=help_text, description=help_text)
    commands = state.add_subparsers(dest="state_command", metavar="COMMAND", required=True)

    def command(name: str, func: Any, text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(name, help=text, description=text)
        p.add_argument("--config", "-c", required=True, help="the daemon's TOML config file")
        p.set_defaults(func=func)
        return p

    command("check", cmd_check, "say whether the daemon would start on its state (read-only)")
    p = command("repair", cmd_repair, "cut a torn tail, rebuild a damaged journal")
    p.add_argument(
        "--discard-checkpoint",
        action="store_true",
        help="set a damaged checkpoint aside (its positions are lost: inputs read in part are "
        "read again from their start)",
    )
    p = command("rename-source", cmd_rename_source, "give a renamed source its positions")
    p.add_argument("old", help="the name the state was written under")
    p.add_argument("new", help="the source's name in the config now")
    p = command("forget-source", cmd_forget_source, "drop a removed source's positions")
    p.add_argument("name", help="a source that is no longer configured")
