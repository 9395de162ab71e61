"""Log set-up: plain text on a terminal, one JSON object per line under systemd or on request."""

from __future__ import annotations

import logging
import os
import sys
import time
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
