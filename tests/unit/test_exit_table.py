"""The README's exit status table is the program's: every status the code can exit with has a
row, every row is a status the code uses, and each row says what the code means by it."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tfrecordd import errors
from tfrecordd.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*(ROOT / "daemon" / "tfrecordd").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
TEST_ONLY = {ROOT / "daemon" / "tfrecordd" / "crashpoints.py"}
"""Exits only a test arms (``TFRECORDD_CRASH_AT`` stands in for a SIGKILL: 137)."""
LITERAL_EXITS = re.compile(
    r"(?:exit_code\s*=\s*|EXIT_[A-Z_]+\s*=\s*)(\d+)\b|(?:_exit|sys\.exit|SystemExit)\((\d+)\)"
)
SIGNAL_EXITS = re.compile(r"_exit\(128 \+ signum\)")


def readme_table() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("| status | means |")
    table = text[start : text.index("\n\n", start)]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", table, re.M)
    assert rows, "no exit status table in README.md"
    return {int(n): meaning for n, meaning in rows}


def statuses_in_code() -> dict[int, list[str]]:
    """Each status a literal in the code exits with, and where."""
    found: dict[int, list[str]] = {}
    for path in SOURCES:
        if path in TEST_ONLY:
            continue
        text = path.read_text()
        for m in LITERAL_EXITS.finditer(text):
            status = int(m.group(1) or m.group(2))
            found.setdefault(status, []).append(str(path.relative_to(ROOT)))
        if SIGNAL_EXITS.search(text):
            # The daemon's second signal: it handles SIGTERM and SIGINT that way.
            for signum in (signal.SIGTERM, signal.SIGINT):
                found.setdefault(128 + signum, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_status_the_code_uses_is_in_the_table() -> None:
    table = readme_table()
    used = statuses_in_code()
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    subclasses = {c.exit_code for c in _error_classes(errors.TfrecorddError)}
    every = set(used) | constants | subclasses | {EXIT_INTERRUPTED, EXIT_BROKEN_PIPE}
    missing = {n: used.get(n, ["tfrecordd.errors / tfrecordd.cli"]) for n in every - set(table)}
    assert not missing, f"statuses used but not in README's exit status table: {missing}"


def test_every_status_in_the_table_is_used() -> None:
    table = readme_table()
    used = set(statuses_in_code()) | {c.exit_code for c in _error_classes(errors.TfrecorddError)}
    used |= {EXIT_INTERRUPTED, EXIT_BROKEN_PIPE}
    assert set(table) <= used, f"rows for statuses nothing exits with: {set(table) - used}"


def test_each_row_means_what_the_code_means() -> None:
    table = readme_table()
    means = {
        errors.EXIT_OK: "success",
        errors.EXIT_FAILURE: "failure",
        errors.EXIT_USAGE: "usage",
        errors.EXIT_DATA: "not sound",
        errors.InputError.exit_code: "missing input",
        errors.EXIT_UNAVAILABLE: "consumer group",
        errors.OutputError.exit_code: "cannot be created",
        errors.EXIT_IO: "I/O",
        errors.EXIT_IN_USE: "in use",
        errors.StateInUseError.exit_code: "in use",
        errors.ListenError.exit_code: "port in use",
        errors.EXIT_CONFIG: "config error",
        errors.StateError.exit_code: "damaged journal",
        EXIT_INTERRUPTED: "Ctrl-C",
        EXIT_BROKEN_PIPE: "SIGPIPE",
        128 + signal.SIGTERM: "second signal",
    }
    wrong = {n: (word, table.get(n)) for n, word in means.items() if word not in table.get(n, "")}
    assert not wrong, f"rows that do not say what the status means: {wrong}"


def _error_classes(base: type[errors.TfrecorddError]) -> list[type[errors.TfrecorddError]]:
    classes = [base]
    for sub in base.__subclasses__():
        classes += _error_classes(sub)
    return classes
