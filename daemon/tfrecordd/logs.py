"""Log set-up: plain text on a terminal, one JSON object per line under systemd or on request;
and :class:`Repeated`, a warning that repeats while a trouble lasts, logged at a bounded rate."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and exception text if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup(fmt: str = "auto", level: int = logging.INFO) -> None:
    """Configure the root logger: ``fmt`` is ``text``, ``json`` or ``auto`` (JSON when stderr is
    systemd's journal, text otherwise)."""
    if fmt == "auto":
        fmt = "json" if os.environ.get("JOURNAL_STREAM") and not sys.stderr.isatty() else "text"
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class Repeated:
    """A warning that may repeat for as long as a trouble lasts (a server down, a listener
    failing): the first is logged, then at most one every ``every`` seconds saying how many were
    left out, and :meth:`ended` logs one line, at the same level, when the trouble is over. The
    limit holds across troubles: a source that flaps (down, up, down) logs at most one warning
    every ``every`` seconds all the same, the ones left out counted in the next. ``clock`` is
    injected by tests."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every = every
        self._clock = clock
        self._began: float | None = None
        self._logged_at: float | None = None
        self._shown = False
        self.failures = 0
        """Warnings since the trouble began (logged or not)."""
        self.left_out = 0
        """Warnings not logged since the last one that was (across troubles)."""

    @property
    def active(self) -> bool:
        """Whether a trouble is going on (a warning came since the last :meth:`ended`)."""
        return self._began is not None

    def warning(self, msg: str, *args: object) -> bool:
        """Log ``msg % args`` as a warning unless one was logged less than ``every`` seconds
        ago; whether it was."""
        now = self._clock()
        self.failures += 1
        if self._began is None:
            self._began = now
        if self._logged_at is not None and now - self._logged_at < self.every:
            self.left_out += 1
            return False
        if self._shown or self.left_out:
            self.logger.warning(
                msg + " (for %.0fs now; %d like it not logged)",
                *args,
                now - self._began,
                self.left_out,
            )
        else:
            self.logger.warning(msg, *args)
        self._logged_at, self.left_out, self._shown = now, 0, True
        return True

    def ended(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` (a warning, as the trouble was), with how long the trouble lasted
        and how many warnings it gave, if one is going on and was shown; then start afresh."""
        if self._began is None:
            return
        if self._shown:
            self.logger.warning(
                msg + " (after %.1fs and %d failure(s))",
                *args,
                self._clock() - self._began,
                self.failures,
            )
        self._began, self.failures, self._shown = None, 0, False
