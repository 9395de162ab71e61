#!/usr/bin/env python3
"""Mutation check of the commit path: break it on purpose, expect the suite to notice.

    python scripts/mutation_check.py                 # every mutation
    python scripts/mutation_check.py --only no-dir-fsync-after-publish --time-limit 600

Each named mutation below is applied to a scratch copy of this tree (never to the tree itself),
and the part of the suite that guards it runs there, bounded in time. The same tests run first
on the unmutated copy: they must pass there, or the verdict says nothing. A mutation is caught
when its tests fail; it survives when they pass. A table is printed; the exit status is 0 only
when every mutation applied cleanly, its tests passed without it and failed with it.

Run it once per change to the commit path (shards, output, pipeline/commit.py, journal,
recovery).
When a mutation no longer applies (the code it edits changed), update its text here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

POWER_CUTS = "tests/reliability/test_power_loss.py::test_power_cuts_lose_nothing_acked"
CRASH_POINTS = "tests/e2e/test_daemon_process.py::test_crash_point_then_restart_is_exactly_once"
KILLS = "tests/reliability/test_crash_harness.py::test_sigkill_spool_directory"
DATASET_ACKS = (
    "tests/reliability/test_datasets_crash.py::"
    "test_a_batch_is_acknowledged_only_once_every_shard_holding_it_is_published"
)
DATASET_KILLS = "tests/reliability/test_datasets_crash.py::test_sigkill_two_datasets_partitioned"
COMMIT = "tests/unit/test_commit.py"
KILLS_THEN_CUTS = "tests/reliability/test_power_loss.py::test_kills_then_power_cuts"
GROWTH = "tests/adversarial/test_spool_growth.py"
SPOOL_MODEL = "tests/adversarial/test_spool_model.py"
WATCHED = "tests/reliability/test_watched_files.py"
DEAD_LETTERS_REMOVED = (
    f"{WATCHED}::test_dead_letters_written_after_the_file_is_removed_are_in_the_file_at_its_path",
    f"{WATCHED}::test_dead_letters_taken_away_while_they_are_written_are_never_lost",
)


@dataclass(frozen=True)
class Mutation:
    """A regular-expression substitution in one file, and the tests that must catch it."""

    name: str
    what: str
    path: str
    pattern: str
    replacement: str
    tests: tuple[str, ...]

    def apply(self, tree: Path) -> bool:
        """Apply to ``tree``; False when the pattern no longer matches exactly once."""
        target = tree / self.path
        text = target.read_text()
        new, n = re.subn(self.pattern, self.replacement, text, flags=re.MULTILINE)
        if n != 1:
            return False
        target.write_text(new)
        return True


MUTATIONS = (
    Mutation(
        "no-dir-fsync-after-publish",
        "the output directory is not fsynced after a shard's publish",
        "daemon/tfrecordd/outputs/output.py",
        r'(crashpoints\.reached\("after-publish"\)\n)'
        r"\s*if self\.fsync:\n\s*self\.fs\.fsync_dir\(os\.path\.dirname\(final\)\)\n",
        r"\1",
        (POWER_CUTS,),
    ),
    Mutation(
        "partition-folder-taken-as-durable",
        "a partition folder found there (or made at once by another shard's publish) is taken "
        "for durable without its parent's fsync",
        "daemon/tfrecordd/outputs/output.py",
        r"^(\s*)if level in self\._durable:\n(\s*)self\._durable\.move_to_end\(level\)\n",
        r"\1if True:\n\2self._durable[level] = None\n",
        (
            f"{COMMIT}::test_a_folder_found_at_start_is_made_durable_before_a_shard_goes_in",
            f"{COMMIT}::test_no_shard_goes_into_a_folder_whose_parent_failed_its_fsync",
            f"{KILLS_THEN_CUTS}_with_two_datasets",
        ),
    ),
    Mutation(
        "recovery-acts-on-unsynced-journal",
        "recovery redoes intents read from the journal without fsyncing it first (a killed "
        "process may have written them without their fsync)",
        "daemon/tfrecordd/state/journal.py",
        r"^(\s*)if self\.fsync:\n(\s*)# What recovery acts on",
        r"\1if False:\n\2# What recovery acts on",
        (
            "tests/unit/test_journal.py::"
            "test_recovery_makes_what_it_read_durable_before_anything_is_redone",
            f"{KILLS_THEN_CUTS}_lose_nothing_acked",
        ),
    ),
    Mutation(
        "dead-letters-not-cut-back",
        "recovery leaves the dead letters of batches no commit covered (their events replay and "
        "are dead-lettered again)",
        "daemon/tfrecordd/pipeline/recovery.py",
        r"if end is not None and \(cut := cut_uncommitted\(",
        r"if False and (cut := cut_uncommitted(",
        ("tests/reliability/test_datasets_crash.py::test_sigkill_two_datasets_partitioned",),
    ),
    Mutation(
        "completion-keeps-uncommitted-watermark",
        "a dataset's completion state keeps the watermark of records no commit covers yet (a "
        "crash then replays them into partitions their own first reading closed)",
        "daemon/tfrecordd/pipeline/completion.py",
        r"watermark, closed = self\._durable",
        r"watermark, closed = self.watermark, self.closed_through",
        (
            "tests/adversarial/test_completion_model.py",
            "tests/reliability/test_dataset_edges.py::"
            "test_a_watermark_moved_by_records_no_commit_covers_closes_nothing_after_a_crash",
        ),
    ),
    Mutation(
        "no-shard-fsync",
        "a finished shard is published without its fsync",
        "daemon/tfrecordd/outputs/shards.py",
        r"^(\s*)if fsync:\n\s*self\.fs\.fsync\(f\)\n",
        r"\1if fsync:\n\1    pass\n",
        (POWER_CUTS,),
    ),
    Mutation(
        "publish-before-intent",
        "swapped order: the shard is published before its intent is journalled",
        "daemon/tfrecordd/pipeline/commit.py",
        r"^(\s*)self\.journal\.write_intent\(intent\)\n((?:.*\n){1,12}?)"
        r"(\s*)each_at_once\(self\._publish_shard, at_once\)\n",
        r"\1pass\n\2\3each_at_once(self._publish_shard, at_once)\n"
        r"\3self.journal.write_intent(intent)\n",
        (CRASH_POINTS,),
    ),
    Mutation(
        "multi-shard-ack",
        "a cut is acknowledged once the shards it publishes are, not waiting for those it keeps "
        "open (which hold records of its batches too)",
        "daemon/tfrecordd/pipeline/commit.py",
        r"^(\s*)self\.unacked\.append\(_Unacked\(intent, kept_open, unit\.events\)\)\n",
        r"\1self.unacked.append(_Unacked(intent, set(), unit.events))\n",
        (DATASET_ACKS,),
    ),
    Mutation(
        "joined-batch-first-position-only",
        "batches joined in the encoder (one source's, encoded together) reach the writer with "
        "only the first one's position",
        "daemon/tfrecordd/pipeline/encode.py",
        r"^(\s*)first\.more \+ tuple\(t for b in batches\[1:\] for t in b\.tokens\),\n",
        r"\1first.more,\n",
        (DATASET_KILLS, "tests/unit/test_joining.py"),
    ),
    Mutation(
        "visible-inprogress-name",
        "an in-progress shard is named so that every *.tfrecord* glob matches it",
        "daemon/tfrecordd/format/writer.py",
        r'^(def inprogress_name\((\w+)[^)]*\)[^:]*:\n(?:\s+""".*"""\n)?)'
        r"(?:    .*\n)*?    return .*\n",
        r'\1    return f"{\2}.inprogress"\n',
        (KILLS,),
    ),
    Mutation(
        "done-dir-in-recursive-spool-accepted",
        "check-config lets a source's done_dir sit where another source reads recursively",
        "daemon/tfrecordd/pathcheck.py",
        r"^(\s*)if _reads\(outer, parts, inner\.path\):\n",
        r'\1if inner.kind == "input" and _reads(outer, parts, inner.path):\n',
        (
            "tests/adversarial/test_config_layouts.py::"
            "test_an_accepted_layout_has_no_source_read_what_another_part_writes",
            "tests/adversarial/test_config_overlaps.py::"
            "test_a_done_dir_inside_another_recursive_spool_is_refused",
        ),
    ),
    Mutation(
        "no-dead-letter-identity-check",
        "the dead-letter file is never checked to still be the one its path names",
        "daemon/tfrecordd/state/deadletter.py",
        r"^(\s*)def _check\(self\) -> None:\n",
        r"\1def _check(self) -> None:\n\1    return\n",
        DEAD_LETTERS_REMOVED,
    ),
    Mutation(
        "dead-letters-not-copied",
        "a dead-letter file made again does not get the lines that may have gone to the old one",
        "daemon/tfrecordd/state/deadletter.py",
        r'^(\s*)copied = b"".join\(self\._unchecked\)\n',
        r'\1copied = b""\n',
        (f"{WATCHED}::test_a_dead_letter_written_as_the_file_goes_is_copied_into_the_new_one",),
    ),
    Mutation(
        "no-finish-check",
        "a spool file is finished without checking it against what was read",
        "plugins/tfrecordd_plugins/sources/spool_finish.py",
        r"^(\s*)why = _changed\(st, read, writers\)\n",
        r'\1why = ""\n',
        (f"{GROWTH}::test_appends_after_the_end_was_read_are_read_on_not_deleted", SPOOL_MODEL),
    ),
    Mutation(
        "no-tail-check",
        "a spool file rewritten to the same size and time is taken for the file read",
        "plugins/tfrecordd_plugins/sources/spool_finish.py",
        r"^(\s*)rewritten = _rewritten\(fd, st, read\)\n",
        r"\1rewritten = False\n",
        (f"{GROWTH}::test_a_file_rewritten_to_the_same_size_is_kept",),
    ),
    Mutation(
        "no-input-boundary",
        "the plugin toolkit's InputBoundary lets every error through",
        "daemon/tfrecordd/boundary.py",
        r"^(\s*)if error is None or not refusable\(error\):\n",
        r"\1if True:\n",
        (
            "tests/adversarial/test_input_boundary.py::"
            "test_any_error_reading_one_file_sets_that_file_aside_and_the_rest_flows",
        ),
    ),
    Mutation(
        "no-connection-boundary",
        "an error serving one connection is let through to the source",
        "plugins/tfrecordd_plugins/sources/socket/server.py",
        r"^(\s*)if not refusable\(e\):\n",
        r"\1if True:\n",
        ("tests/adversarial/test_connection_boundary.py",),
    ),
    Mutation(
        "reload-without-drain",
        "a reload starts a source's new instance before what the old one sent is committed",
        "daemon/tfrecordd/pipeline/reload.py",
        r"^(\s*)d\.write\.request_flush\(\)\n\s*while d\.write\.flushes == seen:.*\n"
        r"\s*await anyio\.sleep\(POLL\)\n",
        r"\1pass\n",
        (f"{KILLS}_with_reloads",),
    ),
    Mutation(
        "node-folder-scanned",
        "the node's claim folder is not among the folders a recursive scan never enters",
        "plugins/tfrecordd_plugins/sources/spool_held.py",
        r"^(\s*)self\._own\.add\(\(held\.st_dev, held\.st_ino\)\)\n",
        r"\1pass\n",
        (
            "tests/adversarial/test_spool_watch.py::"
            "test_a_folder_renamed_within_the_spool_is_put_back_and_nothing_is_lost",
        ),
    ),
)

IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"
)


def run_tests(tree: Path, tests: tuple[str, ...], time_limit: float) -> tuple[str, float]:
    """Run ``tests`` in ``tree``: "passed", "failed", "timed out" or "error (exit N)", and the
    seconds taken."""
    env = os.environ | {"PYTHONPATH": f"{tree / 'daemon'}{os.pathsep}{tree / 'plugins'}"}
    env.pop("TFRECORDD_CRASH_AT", None)
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=time_limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "timed out", time.monotonic() - t0
    took = time.monotonic() - t0
    tail = done.stdout.decode(errors="replace").strip().splitlines()[-1:]
    print(f"    {' '.join(tests)}: exit {done.returncode}: {''.join(tail)}", flush=True)
    # pytest exits 1 when tests failed; any other status (2-5: interrupted, an internal or usage
    # error, nothing collected, e.g. a mutant that does not import) proves nothing.
    outcome = {0: "passed", 1: "failed"}.get(done.returncode, f"error (exit {done.returncode})")
    return outcome, took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", action="append", choices=[m.name for m in MUTATIONS])
    p.add_argument("--time-limit", type=float, default=900, help="seconds per test run")
    args = p.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    rows: list[tuple[str, str, str]] = []
    baselines: dict[tuple[str, ...], str] = {}
    with tempfile.TemporaryDirectory(prefix="tfrecordd-mutants-") as tmp:
        clean = Path(tmp) / "clean"
        shutil.copytree(ROOT, clean, ignore=IGNORE)
        for m in chosen:
            print(f"{m.name}: {m.what}", flush=True)
            if m.tests not in baselines:
                baselines[m.tests] = run_tests(clean, m.tests, args.time_limit)[0]
            base = baselines[m.tests]
            tree = Path(tmp) / m.name
            shutil.copytree(clean, tree, ignore=IGNORE)
            if not m.apply(tree):
                rows.append((m.name, base, "does not apply: update its pattern"))
                continue
            if base != "passed":
                rows.append((m.name, base, "inconclusive: the tests fail without the mutation"))
                continue
            outcome, took = run_tests(tree, m.tests, args.time_limit)
            verdict = {"failed": "caught", "passed": "SURVIVED"}.get(outcome, outcome)
            rows.append((m.name, base, f"{verdict} ({took:.0f}s)"))
            shutil.rmtree(tree, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'mutation':<{width}}  {'unmutated':<10}  with the mutation")
    for name, base, verdict in rows:
        print(f"{name:<{width}}  {base:<10}  {verdict}")
    return 0 if all(r[2].startswith("caught") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
