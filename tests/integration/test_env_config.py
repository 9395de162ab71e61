"""Config values from the environment (``${VAR}``, ``${VAR:-default}``, ``${VAR:?message}``,
``$$``) and from secret files (``${file:PATH}``, ``${credential:NAME}``): substituted in string
values only, every problem a config error naming the key, secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.redis_server import write_redis_config
from tests.support import run_tfrecordd, write_config
from tfrecordd.cli import main
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_CONFIG, EXIT_NOINPUT, ConfigError


def test_variables_defaults_and_escapes_are_substituted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE", "ingest-07")
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("UNSET_ONE", raising=False)
    config = write_config(
        tmp_path,
        daemon={"node_id": "${NODE}", "state_dir": f"{tmp_path}/${{UNSET_ONE:-st}}${{EMPTY:-ate}}"},
        features={"${NODE}": "int64"},
    )
    loaded = load_config(config)
    assert loaded.daemon.node_id == "ingest-07"
    assert loaded.daemon.state_dir == tmp_path / "state"
    escaped = write_redis_config(
        tmp_path, "redis://localhost/0", source={"stream": "cost$$5-$x-$${NODE}"}
    )
    redis = load_config(escaped)
    assert redis.sources[0].model_dump()["stream"] == "cost$5-$x-${NODE}"
    # keys are never substituted: the feature is named as written
    assert list(loaded.encoders["movies"].model_dump()["features"]) == ["${NODE}"]


def test_an_unset_variable_names_itself_and_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TFRECORDD_TEST_UNSET", raising=False)
    monkeypatch.setenv("TFRECORDD_TEST_EMPTY", "")
    config = write_config(
        tmp_path,
        daemon={"node_id": "${TFRECORDD_TEST_UNSET}"},
        output={"prefix": "${TFRECORDD_TEST_EMPTY:?set the prefix}"},
    )
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "daemon.node_id: the environment variable TFRECORDD_TEST_UNSET is not set" in err
    assert "output.prefix: $TFRECORDD_TEST_EMPTY is empty: set the prefix" in err


@pytest.mark.parametrize(
    "bad", ["${NOT CLOSED", "${1BAD}", "${X:+alt}", "${TFRECORDD_TEST_SET:-${OTHER}}"]
)
def test_malformed_references_are_config_errors(
    tmp_path: Path, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A nested reference once gave the variable's value with a stray "}" and no error.
    monkeypatch.setenv("TFRECORDD_TEST_SET", "x")
    config = write_config(tmp_path, output={"prefix": bad})
    with pytest.raises(ConfigError, match=r"output\.prefix: "):
        load_config(config)


def test_a_value_with_a_line_end_after_substitution_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MULTI", "a\nb")
    config = write_config(tmp_path, output={"prefix": "p-${MULTI}"})
    with pytest.raises(ConfigError, match=r"output\.prefix: holds a line end .*\$MULTI"):
        load_config(config)


def test_a_secret_file_is_read_without_its_line_end_and_never_printed(tmp_path: Path) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text("s3cr3t-Pa55 \n\n")
    config = write_redis_config(tmp_path, f"redis://app:${{file:{secret}}}@127.0.0.1:6379/0")
    loaded = load_config(config)
    assert loaded.sources[0].model_dump()["url"] == "redis://app:s3cr3t-Pa55 @127.0.0.1:6379/0"
    # the same secret where a check quotes it: masked in the error
    bad = write_config(tmp_path / "b", daemon={"node_id": f"${{file:{secret}}}"})
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert "daemon.node_id" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_a_credential_is_read_from_the_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "redis").write_text("from-systemd\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    loaded = load_config(write_redis_config(tmp_path, "redis://:${credential:redis}@localhost/0"))
    assert loaded.sources[0].model_dump()["url"] == "redis://:from-systemd@localhost/0"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match=r"sources\[0\]\.url: .*CREDENTIALS_DIRECTORY is not set"):
        load_config(write_redis_config(tmp_path, "redis://:${credential:redis}@localhost/0"))


def test_an_unreadable_secret_file_names_the_key_and_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-secret"
    config = write_redis_config(tmp_path, f"redis://:${{file:{missing}}}@localhost/0")
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"sources[0].url: cannot read the secret file {missing}: No such file" in err


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_missing_config_file_is_one_line_and_exit_66(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.toml"
    args = [command, str(missing)] if command == "check-config" else [command, "-c", str(missing)]
    result = run_tfrecordd(*args)
    assert result.returncode == EXIT_NOINPUT, result.stderr
    assert result.stderr == (
        f"tfrecordd: {missing}: cannot read the config file: No such file or directory\n"
    )


def test_a_variable_under_a_name_a_user_chose_is_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable's value is a secret under a secret-looking setting only: under a feature
    named ``token`` it is a feature's type, shown and logged as it is."""
    from tfrecordd import secretvalues
    from tfrecordd.interpolate import substitute
    from tfrecordd.showconfig import effective

    monkeypatch.setenv("TOKEN_TYPE", "int64")
    monkeypatch.setenv("KIND_DATASET", "movies")
    config = write_config(tmp_path, features={"token": "${TOKEN_TYPE}"})
    shown = effective(load_config(config))
    assert shown["encoders"]["movies"]["features"]["token"]["type"] == "int64"
    assert not secretvalues.is_secret("int64")
    assert substitute("${KIND_DATASET}", "sources[0].route.to.api_key") == "movies"
    assert not secretvalues.is_secret("movies")
    # under a setting that looks secret, it is one
    monkeypatch.setenv("SOME_PASSWORD", "pw-from-env-1")
    assert substitute("${SOME_PASSWORD}", "sources[0].sasl_password") == "pw-from-env-1"
    assert secretvalues.is_secret("pw-from-env-1")
