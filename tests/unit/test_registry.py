"""The plugin registry imports a plugin when it is first asked for, and reports one that fails
to import without taking the others down."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tfrecordd.config import parse_config
from tfrecordd.errors import ConfigError
from tfrecordd.plugin import Registry

GOOD = """
from typing import Literal
from tfrecordd.plugin import EncoderConfig

class LazyGoodConfig(EncoderConfig):
    type: Literal["lazy-good"] = "lazy-good"
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution on ``sys.path`` with two encoders: one that imports, one that raises."""
    (tmp_path / "lazy_good.py").write_text(GOOD)
    (tmp_path / "lazy_bad.py").write_text("raise ImportError('no module named nowhere')\n")
    info = tmp_path / "lazy_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lazy-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tfrecordd.encoders]\nlazy-good = lazy_good:LazyGoodConfig\nlazy-bad = lazy_bad:Nothing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lazy_good", "lazy_bad"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_a_plugin_is_imported_when_first_asked_for(installed: Path) -> None:
    registry = Registry.from_entry_points()
    assert "lazy_good" not in sys.modules
    model = registry.encoders["lazy-good"]
    assert model.__name__ == "LazyGoodConfig"
    assert "lazy_good" in sys.modules
    assert registry.encoders["lazy-good"] is model
    assert "lazy_bad" not in sys.modules
    assert registry.broken == {}


def test_one_that_fails_to_import_is_missing_and_reported(installed: Path) -> None:
    registry = Registry.from_entry_points()
    assert registry.encoders.get("lazy-bad") is None
    assert "lazy-bad" not in registry.encoders
    error = "ImportError: no module named nowhere"
    assert registry.broken == {"tfrecordd.encoders:lazy-bad": error}
    names = list(registry.encoders)
    assert {"lazy-good", "example"} <= set(names)
    assert "lazy-bad" not in names
    assert len(registry.encoders) == len(names)


def test_a_config_naming_a_broken_plugin_says_why(installed: Path, tmp_path: Path) -> None:
    data = {
        "daemon": {"node_id": "n", "state_dir": str(tmp_path / "state")},
        "output": {"dir": str(tmp_path / "shards")},
        "sources": [
            {"name": "s", "type": "directory", "path": str(tmp_path / "in"), "encoder": "e"}
        ],
        "encoders": {"e": {"type": "lazy-bad"}},
    }
    with pytest.raises(ConfigError, match="installed but failed to load: ImportError"):
        parse_config(data, Registry.from_entry_points())
    data["encoders"] = {"e": {"type": "lazy-good"}}
    config = parse_config(data, Registry.from_entry_points())
    assert type(config.encoders["e"]).__name__ == "LazyGoodConfig"
    assert "lazy_bad" not in sys.modules
