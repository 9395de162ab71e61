"""The README's first steps keep their promises: the demo drains on Ctrl-C, and the shard tools
take a shell glob of the output directory (shards and manifests) as users type it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import (
    free_port,
    movie_event,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.errors import EXIT_OK
from tfrecordd.outputs.manifest import SUFFIX as MANIFEST_SUFFIX

ROOT = Path(__file__).resolve().parents[2]


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd(*args)


def test_the_demo_drains_on_ctrl_c(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    demo = (ROOT / "config" / "demo.toml").read_text()
    demo = demo.replace('listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{free_port()}"')
    (tmp_path / "config" / "demo.toml").write_text(demo)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        # A session of its own: the script's process group is what a terminal's foreground job
        # is, and Ctrl-C is SIGINT to that whole group.
        script = subprocess.Popen(
            ["bash", str(tmp_path / "scripts" / "demo.sh")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | {"DEMO_SKIP_INSTALL": "1"},
            start_new_session=True,
        )
    try:
        wait_for(lambda: "files produced: 3" in log.read_text(errors="replace"), 90)
        os.killpg(script.pid, signal.SIGINT)
        script.wait(90)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(30)
    said = log.read_text(errors="replace")
    assert "tfrecordd exited with status 0" in said, said
    assert "exiting at once" not in said, said
    assert re.search(r"OK +demo/shards/", said), said
    shards = tmp_path / "demo" / "shards"
    assert not [p for p in shards.rglob("*") if p.name.endswith(".inprogress")]
    assert list(shards.glob("*.tfrecord.gz"))


def test_the_shard_tools_take_a_glob_of_the_output_directory(tmp_path: Path) -> None:
    config = write_config(tmp_path, output={"max_shard_records": 40, "max_shard_age": "1s"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    # Drained means acknowledged: a daemon stopped once the file is only claimed leaves it
    # claimed, unread, for its next start.
    run_clean_until(config, lambda: spool_drained(tmp_path / "spool"))
    out = tmp_path / "shards"
    # What `shards/*` expands to in a shell: no dotfiles (the staging folder is one).
    everything = sorted(str(p) for p in out.iterdir() if not p.name.startswith("."))
    manifests = [p for p in everything if p.endswith(MANIFEST_SUFFIX)]
    assert manifests  # the case at hand: manifests on by default

    verify = _tool("verify", *everything)
    assert verify.returncode == EXIT_OK, verify.stdout + verify.stderr
    assert "total: 100 records in 3 files, 0 bad" in verify.stdout
    for m in manifests:
        assert f"skipping {m}: a manifest, checked with its shard" in verify.stderr

    cat = _tool("cat", *everything)
    assert cat.returncode == EXIT_OK, cat.stderr
    assert len(cat.stdout.splitlines()) == 100

    gz = tmp_path / "gz"
    gz.mkdir()
    transcode = _tool("transcode", *everything, "--to", "zlib", "--out", str(gz))
    assert transcode.returncode == EXIT_OK, transcode.stderr
    assert len(list(gz.iterdir())) == 3

    alone = _tool("verify", *manifests)
    assert alone.returncode == 66, alone.stdout + alone.stderr
    assert "no shard among the paths given" in alone.stderr
    assert "give its shard to check both" in alone.stderr
