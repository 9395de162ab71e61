"""Where a location points: plain paths, ``file://`` and ``local://`` URLs are the same local
directory to the daemon's output, its path checks, its state commands and the reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import write_config
from tfrecordd.config import load_config
from tfrecordd.errors import ConfigError
from tfrecordd.format.framing import frame_many
from tfrecordd.format.reader import iter_records
from tfrecordd.fsys import LOCAL, is_url, local_path
from tfrecordd.outputs import make_output
from tfrecordd.outputs.output import LocalOutput

LOCAL_PREFIXES = ["", "file://", "local://"]


@pytest.mark.parametrize(
    ("location", "url"),
    [
        ("/data/shards", False),
        ("shards", False),
        ("file:///data/shards", False),
        ("local:///data/shards", False),
        ("s3://bucket/shards", True),
        ("gs://bucket/shards", True),
        ("memory://shards", True),
    ],
)
def test_is_url_and_local_path_agree(location: str, url: bool) -> None:
    assert is_url(location) is url
    if not url:
        assert "://" not in local_path(location)
        assert local_path(location).endswith("shards")


@pytest.mark.parametrize("prefix", LOCAL_PREFIXES)
def test_a_local_output_url_is_the_directory_it_names(tmp_path: Path, prefix: str) -> None:
    cfg = load_config(write_config(tmp_path, output={"dir": f"{prefix}{tmp_path / 'shards'}"}))
    out = make_output(cfg, LOCAL)
    assert isinstance(out, LocalOutput)
    assert out.location == str(tmp_path / "shards")


@pytest.mark.parametrize("prefix", LOCAL_PREFIXES)
def test_a_local_output_url_inside_a_spool_is_refused(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(ConfigError, match=r"output\.dir"):
        load_config(write_config(tmp_path, output={"dir": f"{prefix}{tmp_path / 'spool' / 'x'}"}))


@pytest.mark.parametrize("prefix", LOCAL_PREFIXES)
def test_the_reader_opens_a_local_url_as_the_file(tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "x.tfrecord"
    path.write_bytes(frame_many([b"a", b"bc"]))
    assert list(iter_records(f"{prefix}{path}")) == [b"a", b"bc"]
