"""Log lines: JSON objects under systemd or on request, plain text otherwise."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from tfrecordd import logs


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("json")
    logging.getLogger("tfrecordd").info("published %s: %d records", "part-1.tfrecord.gz", 7)
    try:
        raise ValueError("disk on fire")
    except ValueError:
        logging.getLogger("tfrecordd").exception("stopping")
    first, second = (json.loads(x) for x in capsys.readouterr().err.splitlines() if x[:1] == "{")
    assert first["message"] == "published part-1.tfrecord.gz: 7 records"
    assert (first["level"], first["logger"]) == ("info", "tfrecordd")
    assert first["time"].endswith("Z")
    assert "ValueError: disk on fire" in second["exception"]


def test_auto_is_json_under_systemd_journal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    logs.setup("auto")
    logging.getLogger("tfrecordd").warning("output nearly full")
    assert json.loads(capsys.readouterr().err)["level"] == "warning"


def test_text_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("text")
    logging.getLogger("tfrecordd").info("started")
    line = capsys.readouterr().err
    assert "INFO" in line
    assert "tfrecordd: started" in line
