"""The README's examples stay true: its config validates, its socket client is the tested one."""

from __future__ import annotations

import re
from pathlib import Path

from tfrecordd.config import load_config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_readme_config_validates(tmp_path: Path) -> None:
    [main_example] = [b for b in blocks(README, "toml") if "[[sources]]" in b]
    path = tmp_path / "readme.toml"
    path.write_text(main_example)
    config = load_config(path)
    assert config.sources[0].name == "spool"
    assert config.fed_datasets(config.sources[0]) == ["clicks", "impressions"]
    assert config.datasets["clicks"].compression == "gzip"
    assert config.datasets["clicks"].partition.time == "event"
    assert config.datasets["clicks"].completion is not None


def test_the_readme_socket_client_is_the_documented_one() -> None:
    """tests/integration/test_socket_sources.py runs the client of docs/sources/sockets.md
    against a live daemon; the README shows the same code."""
    docs = (ROOT / "docs" / "sources" / "sockets.md").read_text()

    def client(text: str) -> str:
        [code] = [b for b in blocks(text, "python") if "def send_acked" in b]
        return code

    assert client(README) == client(docs)
    assert len(client(README).strip().splitlines()) <= 16
