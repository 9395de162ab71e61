"""``tfrecordd schema``: the reader's feature description of each configured encoder."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tfrecordd.cli import main
from tfrecordd.cli.describe import describe_encoder
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_CONFIG, EXIT_USAGE

DOCS = Path(__file__).parents[2] / "docs" / "encoders.md"

CONFIG = """\
[daemon]
state_dir = "{root}/state"
[metrics]
enabled = false
[output]
dir = "{root}/out"
[[sources]]
name = "spool"
type = "directory"
path = "{root}/spool"
encoder = "movies"

[encoders.movies]
type = "example"
[encoders.movies.features]
id = {{ type = "int64", required = true, shape = [] }}
user = "bytes"
ratings = {{ type = "float", shape = [2], default = [0, 0] }}
tags = {{ type = "bytes", separator = "|" }}

[encoders.pets]
type = "image"
labels = {{ cat = 0, dog = 1 }}
unknown_label = "omit"

[encoders.ready]
type = "passthrough"

{tagging}
"""


def docs_block(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```", DOCS.read_text(), re.S)
    assert match is not None, marker
    return match.group(1)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tfrecordd.toml"
    tagging = docs_block("sequence-labelling-config")
    path.write_text(CONFIG.format(root=tmp_path, tagging=tagging))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["schema", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_python_output_for_an_example_encoder(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--config", str(config), "--encoder", "movies")
    assert (code, err) == (0, "")
    assert out == (
        "import tensorflow as tf\n"
        "\n"
        "# encoder 'movies' (type 'example'): tf.io.parse_example(serialized, features)\n"
        "features = {\n"
        "    'id': tf.io.FixedLenFeature(shape=[], dtype=tf.int64),\n"
        "    'user': tf.io.VarLenFeature(dtype=tf.string),\n"
        "    'ratings': tf.io.FixedLenFeature(shape=[2], dtype=tf.float32, default_value=[0, 0]),\n"
        "    'tags': tf.io.VarLenFeature(dtype=tf.string),\n"
        "}\n"
    )


def test_json_output_is_the_encoders_description(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encoders = load_config(config).encoders
    for name in ("movies", "pets", "tagging"):
        code, out, _ = run(capsys, "-c", str(config), "--encoder", name, "--format", "json")
        assert code == 0
        assert json.loads(out) == describe_encoder(name, encoders[name])
    _, out, _ = run(capsys, "-c", str(config), "--encoder", "pets", "--format", "json")
    assert json.loads(out)["image/class/label"] == {
        "kind": "FixedLenFeature",
        "shape": [],
        "dtype": "int64",
        "default_value": -1,
    }


def test_documented_sequence_reader_is_what_the_command_prints(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "-c", str(config), "--encoder", "tagging")
    assert code == 0
    documented = re.search(r"prints its reader:\n\n```python\n(.*?)```", DOCS.read_text(), re.S)
    assert documented is not None
    assert out == documented.group(1)
    assert "context_features = {\n" in out
    compile(out, "<schema>", "exec")


def test_passthrough_cannot_be_described(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "-c", str(config), "--encoder", "ready")
    assert (code, out) == (1, "")
    assert "encoder 'ready' (type 'passthrough')" in err
    assert "writes the records it is given unchanged" in err


def test_an_older_config_is_one_dataset_described_by_default(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four encoders, one of them fed: the config's one dataset, named after it."""
    code, out, err = run(capsys, "-c", str(config))
    assert (code, err) == (0, "")
    assert out.splitlines()[2] == (
        "# dataset 'movies', encoder 'movies' (type 'example'): "
        "tf.io.parse_example(serialized, features)"
    )
    by_encoder = run(capsys, "-c", str(config), "--encoder", "movies")[1]
    assert out.splitlines()[3:] == by_encoder.splitlines()[3:]


def test_a_name_the_config_lacks_is_a_usage_error(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "-c", str(config), "--encoder", "nope")
    assert (code, out) == (EXIT_USAGE, "")
    assert "no [encoders.nope] table (encoders: movies, pets, ready, tagging)" in err
    code, out, err = run(capsys, "-c", str(config), "--dataset", "nope")
    assert (code, out) == (EXIT_USAGE, "")
    assert err == f"tfrecordd: {config}: no dataset 'nope' (datasets: movies)\n"
    code, out, err = run(capsys, "-c", str(config), "--dataset", "movies", "--encoder", "pets")
    assert (code, out) == (EXIT_USAGE, "")
    assert "give one" in err


def test_only_encoder_is_the_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.toml"
    text = CONFIG.format(root=tmp_path, tagging="")
    path.write_text(text[: text.index("[encoders.pets]")])
    code, out, _ = run(capsys, "-c", str(path), "--format", "json")
    assert code == 0
    assert set(json.loads(out)) == {"id", "user", "ratings", "tags"}


def test_invalid_config_exits_78(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    text = CONFIG.format(root=tmp_path, tagging="").replace('user = "bytes"', 'user = "text"')
    path.write_text(text)
    code, out, err = run(capsys, "-c", str(path), "--encoder", "movies")
    assert (code, out) == (EXIT_CONFIG, "")
    assert "encoders.movies.features.user" in err


def strict_json(text: str) -> object:
    """``text`` parsed as JSON is defined (RFC 8259): no NaN, Infinity or -Infinity tokens."""

    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_with_non_finite_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nan.toml"
    text = CONFIG.format(root=tmp_path, tagging="")
    features = (
        "[encoders.movies.features]\n"
        "a = { type = 'float', default = nan }\n"
        "b = { type = 'float', shape = [3], default = [inf, -inf, 1.5] }\n"
        "c = { type = 'float', shape = [2, 1], default = [[-nan], [0.25]] }\n"
    )
    path.write_text(text[: text.index("[encoders.movies.features]")] + features)
    code, out, err = run(capsys, "-c", str(path), "--format", "json")
    assert (code, err) == (0, "")
    description = strict_json(out)
    assert description == {
        "a": {"kind": "VarLenFeature", "dtype": "float32"},
        "b": {
            "kind": "FixedLenFeature",
            "shape": [3],
            "dtype": "float32",
            "default_value": ["Infinity", "-Infinity", 1.5],
        },
        "c": {
            "kind": "FixedLenFeature",
            "shape": [2, 1],
            "dtype": "float32",
            "default_value": [["NaN"], [0.25]],
        },
    }
    # What the docs promise a reader: float() gives back the values the encoder writes.
    assert [float(v) for v in description["b"]["default_value"]] == [math.inf, -math.inf, 1.5]
    assert math.isnan(float(description["c"]["default_value"][0][0]))
    code, source, _ = run(capsys, "-c", str(path))
    assert code == 0
    assert "default_value=[float('inf'), float('-inf'), 1.5]" in source
