"""Config validation: the documented examples load, and every error is reported at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfrecordd.cli import main
from tfrecordd.config import load_config
from tfrecordd.errors import ConfigError
from tfrecordd.units import format_duration, format_size, parse_duration, parse_size

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("500ms", 0.5), ("2h", 7200), ("1d", 86400), (5, 5), ("1.5s", 1.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [("64MiB", 64 << 20), ("1GB", 10**9), ("512KiB", 512 << 10), (4096, 4096), ("100B", 100)],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["abc", "-1s", True, "10 parsecs", None])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_format_round_trips() -> None:
    for s in (0.5, 30, 600, 86400, 1.25):
        assert parse_duration(format_duration(s)) == s
    for n in (1, 4096, 64 << 20, 3 << 30):
        assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("name", ["tfrecordd.toml", "docker.toml", "demo.toml"])
def test_shipped_configs_are_valid(name: str) -> None:
    config = load_config(ROOT / "config" / name)
    assert config.sources[0].type == "directory"
    for dataset in config.fed_datasets(config.sources[0]):
        assert config.encoders[config.datasets[dataset].encoder].type == "example"


def test_the_example_config_loads_as_written() -> None:
    config = load_config(ROOT / "config" / "tfrecordd.toml")
    assert config.daemon.node_id == "ingest-01"
    assert config.daemon.drain_timeout == 30
    assert config.output is None
    clicks = config.datasets["clicks"]
    assert clicks.max_shard_bytes == 256 << 20
    assert clicks.max_shard_age == 600
    assert clicks.compression == "gzip"
    assert (clicks.partition.time, clicks.partition.time_field) == ("event", "ts")
    assert clicks.completion is not None
    assert config.fed_datasets(config.sources[0]) == ["clicks", "impressions"]
    assert config.metrics.listen == "127.0.0.1:9464"


def test_every_error_at_once_with_locations(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        """
[daemon]
drain_timeout = "soon"
colour = "blue"
[output]
dir = "/tmp/x"
max_shard_bytes = "12XB"
[[sources]]
name = "inbox"
type = "directory"
path = "/tmp/in"
poll_interval = -1
encoder = "nope"
[[sources]]
name = "inbox"
type = "kafka"
encoder = "m"
[encoders.m]
type = "example"
features = { a = "int32" }
"""
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    errors = info.value.errors
    expected = [
        "daemon.drain_timeout:",
        "daemon.colour: unknown key",
        "output.max_shard_bytes:",
        "sources[0].encoder: no [encoders.nope] table [source 'inbox', type 'directory']",
        "sources[0].poll_interval: a duration cannot be negative (got -1)",
        "sources[1].type: unknown source type 'kafka'",
        "encoders.m.features.a.type:",
    ]
    for prefix in expected:
        assert any(e.startswith(prefix) for e in errors), (prefix, errors)


def test_check_config_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(ROOT / "config" / "tfrecordd.toml")]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[output]\n")
    assert main(["check-config", str(bad)]) == 78
    err = capsys.readouterr().err
    assert "output.dir: Field required" in err
    assert "sources: Field required" in err
    bad.write_text("not toml [")
    assert main(["check-config", str(bad)]) == 78


def test_listeners_default_to_loopback() -> None:
    """Invariant 9: nothing listens beyond the machine unless the config says so."""
    from tfrecordd.config import MetricsSection
    from tfrecordd.endpoints import split_host_port
    from tfrecordd_plugins.sources.socket import TcpSourceConfig, UdpSourceConfig

    defaults = [
        MetricsSection().listen,
        TcpSourceConfig(name="t", encoder="e").listen,
        UdpSourceConfig(name="u", encoder="e").listen,
    ]
    assert [split_host_port(d)[0] for d in defaults] == ["127.0.0.1"] * 3


@pytest.mark.parametrize("name", [".", ".."])
def test_a_source_named_dot_or_dot_dot_is_refused(tmp_path: Path, name: str) -> None:
    """A source's name names its state folder, ``state_dir/sources/<name>/``: ``..`` would be
    ``state_dir`` itself."""
    path = tmp_path / "c.toml"
    path.write_text(
        f"""
[output]
dir = "{tmp_path / "out"}"
[[sources]]
name = "{name}"
type = "udp"
listen = "127.0.0.1:0"
encoder = "m"
[encoders.m]
type = "example"
features = {{ a = "int64" }}
"""
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"sources[0].name: must not be {name!r}" in info.value.errors
