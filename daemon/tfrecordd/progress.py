"""Progress for CLI work over many files: a bar on a terminal, one plain line per file elsewhere.

On a terminal the bar is redrawn in place on one line (``\\r`` and an ANSI erase, no curses) and
shows files done out of the total, the records read so far and the file being read; it is
erased before anything else is printed and when the work ends. Anywhere else (a log file, a
pipe, CI) each finished file gets one line, so the output stays readable and greppable::

    verify: 3/10 shards/part-0003.tfrecord.gz: 5120 records
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_ERASE = "\r\x1b[K"
_BAR_WIDTH = 24
_REDRAW_INTERVAL = 0.1


class Progress:
    """Reports progress over ``total`` files on ``stream`` (default: stderr).

    ``tty`` says whether to draw a bar; by default it is whether ``stream`` is a terminal.
    Otherwise one plain line is written per finished file, unless ``lines`` is false (for a
    command that already prints a line per file itself).
    Call :meth:`start` when a file begins, :meth:`advance` as its records are read,
    :meth:`clear` before printing anything else to the same terminal, :meth:`done` when the file
    is finished and :meth:`close` at the end (or use the object as a context manager).
    """

    def __init__(
        self,
        action: str,
        total: int,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        lines: bool = True,
    ) -> None:
        self.action = action
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.lines = lines
        self.files_done = 0
        self.records = 0
        self._current = ""
        self._shown = False
        self._drawn_at = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, name: str) -> None:
        """A file begins."""
        self._current = name
        self._draw(force=True)

    def advance(self, records: int) -> None:
        """``records`` more records were read from the current file."""
        self.records += records
        self._draw(force=False)

    def done(self, name: str, detail: str) -> None:
        """A file is finished; ``detail`` says how it went (``"5120 records"``, an error)."""
        self.files_done += 1
        self._current = ""
        if self.tty:
            self._draw(force=True)
        elif self.lines:
            self.stream.write(f"{self.action}: {self.files_done}/{self.total} {name}: {detail}\n")
            self.stream.flush()

    def clear(self) -> None:
        """Erase the bar, so a line printed next to it starts on a clean line."""
        if self._shown:
            self.stream.write(_ERASE)
            self.stream.flush()
            self._shown = False

    def close(self) -> None:
        """The work is over: erase the bar."""
        self.clear()

    def _draw(self, *, force: bool) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < _REDRAW_INTERVAL:
            return
        self._drawn_at = now
        filled = _BAR_WIDTH * self.files_done // self.total if self.total else _BAR_WIDTH
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        line = f"{self.action} [{bar}] {self.files_done}/{self.total} files, {self.records} records"
        if self._current:
            line += f"  {self._current}"
        width = _columns(self.stream)
        if len(line) > width - 1:
            line = line[: max(width - 2, 0)] + "…"
        self.stream.write(_ERASE + line)
        self.stream.flush()
        self._shown = True


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80
    # A terminal that never had its size set (a fresh pty, a serial console) reports 0.
    return columns if columns > 0 else 80
