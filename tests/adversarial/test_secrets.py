"""Secrets in the config never reach what tfrecordd prints: config errors, ``check-config``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import run_tfrecordd, write_config
from tfrecordd.errors import EXIT_CONFIG, ConfigError
from tfrecordd.redact import REDACTED, redact_options, redact_text, redact_url

SECRET = "hunter2-s3cr3t"


def _check_config(config: Path) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd("check-config", str(config))


@pytest.mark.parametrize(
    "url",
    [
        f"http://default:{SECRET}@127.0.0.1:6379/0",  # wrong scheme: the message quotes the URL
        f"http://:{SECRET}@127.0.0.1:6379/0",
        f"http://{SECRET}@127.0.0.1:6379/0",  # a lone user name is often a token
        f"http://127.0.0.1:6379/0?password={SECRET}",
    ],
)
def test_a_redis_url_in_a_config_error_is_redacted(tmp_path: Path, url: str) -> None:
    config = tmp_path / "tfrecordd.toml"
    config.write_text(
        f'[output]\ndir = "{tmp_path / "shards"}"\n'
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        "[[sources]]\n"
        f'name = "r"\ntype = "redis-stream"\nencoder = "e"\nurl = "{url}"\n'
        'stream = "s"\ngroup = "g"\n'
        '[encoders.e]\ntype = "example"\n[encoders.e.features]\nid = { type = "int64" }\n'
    )
    run = _check_config(config)
    assert run.returncode == EXIT_CONFIG, run.stdout + run.stderr
    assert "sources[0].url" in run.stderr
    assert "127.0.0.1:6379" in run.stderr  # still says which URL
    assert SECRET not in run.stdout + run.stderr


def test_check_config_prints_no_storage_option_value_unless_known_harmless(
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path,
        output={
            "dir": "memory://bucket/shards",
            "storage_options": {"connection_string": f"AccountName=a;AccountKey={SECRET};"},
        },
    )
    run = _check_config(config)
    assert SECRET not in run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"'connection_string': '{REDACTED}'" in run.stdout


def test_options_are_redacted_by_default() -> None:
    options = {
        "connection_string": f"AccountKey={SECRET}",
        "account_name": "acct",
        "headers": {"X-Custom": SECRET},
        "endpoint_url": f"https://user:{SECRET}@minio.local:9000",
        "client_kwargs": {"region_name": "eu-west-1", "api_key": SECRET},
        "anon": False,
    }
    cleaned = redact_options(options)
    assert SECRET not in repr(cleaned)
    assert cleaned == {
        "connection_string": REDACTED,
        "account_name": REDACTED,
        "headers": REDACTED,
        "endpoint_url": f"https://user:{REDACTED}@minio.local:9000",
        "client_kwargs": {"region_name": "eu-west-1", "api_key": REDACTED},
        "anon": False,
    }


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        (f"got 'rediss://u:{SECRET}@h/1' here", "got 'rediss://u:***@h/1' here"),
        (f"DefaultEndpointsProtocol=https;AccountKey={SECRET};", "AccountKey=***;"),
        (f"https://acct.blob.example/c?sv=1&sig={SECRET}", "sv=1&sig=***"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
    ],
)
def test_free_text_is_redacted(text: str, kept: str) -> None:
    out = redact_text(text)
    assert SECRET not in out
    assert kept in out


def test_config_errors_are_redacted_wherever_they_are_made() -> None:
    error = ConfigError([f"output.dir: cannot reach s3://k:{SECRET}@host/b"])
    assert SECRET not in str(error)
    assert SECRET not in repr(error.errors)
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix"
