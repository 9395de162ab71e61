"""A conversion's progress on stderr: on a terminal a bar redrawn in place (input bytes done of
the total, records, rate, ETA); anywhere else (a log, a pipe, CI) one plain line every
``interval`` seconds, so a long run shows it is alive without filling its log."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

_ERASE = "\r\x1b[K"
_BAR = 20
_REDRAW = 0.2


def human_size(n: float) -> str:
    """Bytes for people: ``512 B``, ``12.6 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Meter:
    """Progress over ``total`` input bytes; :meth:`update` as work is done, :meth:`close` at
    the end."""

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval: float = 10.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            try:
                tty = self.stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty
        self.total = total
        self.done = self.start_done = done
        self.records = 0
        self.interval = interval
        self.started = time.monotonic()
        # A bar shows at the first update; plain lines start after an interval.
        self._shown_at = float("-inf") if tty else self.started
        self._drawn = False

    def update(self, input_bytes: int, records: int) -> None:
        """``input_bytes`` more of the input read, ``records`` more records written."""
        self.done += input_bytes
        self.records += records
        now = time.monotonic()
        if now - self._shown_at >= (_REDRAW if self.tty else self.interval):
            self._shown_at = now
            self._show(now)

    def line(self, now: float) -> str:
        """The progress as one line."""
        elapsed = max(now - self.started, 1e-9)
        rate = self.records / elapsed
        byte_rate = (self.done - self.start_done) / elapsed
        pct = 100 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / byte_rate if byte_rate > 0 else 0.0
        # What matters most first: a narrow terminal cuts the end of the line.
        return (
            f"{pct:5.1f}%, ETA {_duration(eta)}, {rate:,.0f} records/s, {self.records} records, "
            f"{human_size(self.done)} of {human_size(self.total)} ({human_size(byte_rate)}/s)"
        )

    def _show(self, now: float) -> None:
        text = self.line(now)
        if not self.tty:
            self.stream.write(f"convert: {text}\n")
            self.stream.flush()
            return
        filled = _BAR * self.done // self.total if self.total else _BAR
        bar = "#" * filled + "." * (_BAR - filled)
        line = f"convert [{bar}] {text}"
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            width = 80
        self.stream.write(_ERASE + line[: max(width - 1, 1)])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar."""
        if self._drawn:
            self.stream.write(_ERASE)
            self.stream.flush()
            self._drawn = False
