"""``tfrecordd check-config --show``: the config in effect as TOML, every secret masked, run
as a user runs it."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel

from tests.support import daemon_process, run_tfrecordd, write_config
from tfrecordd.config import load_config
from tfrecordd.showconfig import effective, masked


def test_show_prints_the_effective_config_with_every_secret_masked(tmp_path: Path) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text("hunter2-from-a-file\n")
    (tmp_path / "out").mkdir()
    config = tmp_path / "show.toml"
    config.write_text(
        f"""[daemon]
node_id = "${{SHOW_NODE}}"
state_dir = "{tmp_path}/state"
[metrics]
enabled = false
[datasets.events]
encoder = "events"
dir = "{tmp_path}/out"
storage_options = {{ }}
[[sources]]
name = "redis"
type = "redis-stream"
url = "redis://app:${{file:{secret}}}@127.0.0.1:6379/0"
stream = "events"
dataset = "events"
[[sources]]
name = "sock"
type = "unix"
path = "{tmp_path}/in.sock"
dataset = "events"
[encoders.events]
type = "example"
features = {{ id = "int64" }}
"""
    )
    env = dict(os.environ, SHOW_NODE="node-9")
    result = run_tfrecordd("check-config", "--show", "--config", str(config), env=env)
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    shown = tomllib.loads(result.stdout)
    assert shown["daemon"]["node_id"] == "node-9"
    assert shown["daemon"]["drain_timeout"] == "30s"  # a default, filled in
    assert shown["sources"][0]["url"] == "redis://app:***@127.0.0.1:6379/0"
    assert "mode = 0o660" in result.stdout
    assert shown["sources"][1]["mode"] == 0o660
    # what it prints is a config that loads as the same one
    again = tmp_path / "again.toml"
    again.write_text(result.stdout)
    reloaded = load_config(again)
    assert reloaded.daemon.node_id == "node-9"
    assert [s.name for s in reloaded.sources] == ["redis", "sock"]


def test_show_takes_the_config_as_an_argument_too(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = run_tfrecordd("check-config", str(config), "--show")
    assert result.returncode == 0, result.stderr
    assert tomllib.loads(result.stdout)["sources"][0]["name"] == "spool"
    assert run_tfrecordd("check-config").returncode == 2


def test_a_secret_read_from_a_file_is_masked_in_the_daemon_log(tmp_path: Path) -> None:
    secret = tmp_path / "node-name"
    secret.write_text("node-secret-7\n")
    config = write_config(tmp_path, daemon={"node_id": f"${{file:{secret}}}"})
    with daemon_process(config) as daemon:
        daemon.wait_started()
        assert daemon.stop() == 0
        log = daemon.output()
    assert "started: node ***" in log
    assert "node-secret-7" not in log


def test_a_dollar_in_a_value_is_shown_escaped_and_loads_back_the_same(tmp_path: Path) -> None:
    # `$$$$` in the file is `$$` in effect: what --show prints must load back as `$$` too.
    path = "item.$$$$hashKey-$${x}"
    config = write_config(tmp_path, features={"hk": {"type": "bytes", "path": path}})
    first = effective(load_config(config))
    assert first["encoders"]["movies"]["features"]["hk"]["path"] == "item.$$hashKey-${x}"
    result = run_tfrecordd("check-config", "--show", "--config", str(config))
    assert result.returncode == 0, result.stderr
    again = tmp_path / "again.toml"
    again.write_text(result.stdout)
    assert effective(load_config(again)) == first


def test_names_a_user_chose_are_never_masked_for_what_they_say(tmp_path: Path) -> None:
    """Features, route values and datasets named like secrets are shown as declared, and the
    shown config loads back as the same one; a secret read from a file is still masked."""
    (tmp_path / "out").mkdir()
    secret = tmp_path / "password"
    secret.write_text("s3cr3t-value\n")
    config = tmp_path / "named.toml"
    config.write_text(
        f"""[daemon]
node_id = "n"
state_dir = "{tmp_path}/state"
[metrics]
enabled = false
[datasets.tokens]
encoder = "auth"
dir = "{tmp_path}/out/tokens"
[datasets.passkeys]
encoder = "auth"
dir = "{tmp_path}/out/passkeys"
[[sources]]
name = "redis"
type = "redis-stream"
url = "redis://app:${{file:{secret}}}@127.0.0.1:6379/0"
stream = "events"
route = {{ field = "kind", to = {{ api_key = "tokens", passkey = "passkeys" }} }}
[encoders.auth]
type = "example"
features = {{ api_key = "bytes", secret_id = {{ type = "int64", path = "auth.token_id" }} }}
"""
    )
    result = run_tfrecordd("check-config", "--show", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "s3cr3t" not in result.stdout
    shown = tomllib.loads(result.stdout)
    assert shown["sources"][0]["url"] == "redis://app:***@127.0.0.1:6379/0"
    assert shown["sources"][0]["route"]["to"] == {"api_key": "tokens", "passkey": "passkeys"}
    features = shown["encoders"]["auth"]["features"]
    assert "***" not in repr(features)
    assert features["secret_id"]["path"] == "auth.token_id"
    again = tmp_path / "again.toml"
    again.write_text(result.stdout.replace("app:***@", "app:s3cr3t-value@"))
    assert effective(load_config(again)) == effective(load_config(config))


class _Settings(BaseModel):
    api_password: str
    url: str
    features: dict[str, str]
    options: dict[str, str]
    nested: list[dict[str, str]]


def test_a_setting_named_like_a_secret_is_masked_and_a_name_is_not() -> None:
    """Settings and the keys of option tables are masked by what they say; the keys of the
    tables a user names (features, route values, labels) are not."""
    settings = _Settings(
        api_password="plain-in-the-file",
        url="https://user:pw@example.com/x",
        features={"api_password": "bytes", "token": "int64"},
        options={"sasl_password": "in-the-file", "client_id": "c1"},
        nested=[{"secret": "in-a-list"}],
    )
    assert masked(settings) == {
        "api_password": "***",
        "url": "https://user:***@example.com/x",
        "features": {"api_password": "bytes", "token": "int64"},
        "options": {"sasl_password": "***", "client_id": "c1"},
        "nested": [{"secret": "***"}],
    }
