"""The README's walkthrough, run as written: every command a newcomer types after the first of
the two commands, in an empty folder, ends without a traceback and says what the README says
it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough() -> str:
    text = README.read_text()
    block = re.search(r"<!-- walkthrough -->\n```sh\n(.*?)```\n<!-- /walkthrough -->", text, re.S)
    assert block is not None, "the README has no walkthrough block"
    return block.group(1)


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("TFRECORDD_CRASH_AT", None)
    out = subprocess.run(
        ["bash", "-e", "-c", walkthrough()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (tmp_path / "daemon.log").read_text() if (tmp_path / "daemon.log").exists() else ""
    said = out.stdout + out.stderr
    assert out.returncode == 0, f"{said}\n--- daemon.log\n{log}"
    assert "Traceback" not in said + log, said + log
    assert "walk.toml: OK" in said
    assert re.search(r"written +3 records", said), said
    assert "tfrecordd (PID" in said
    assert "reloaded its config: applied" in said
    assert '"user":["ada"]' in said  # cat: the click, read from its hour's folder
    assert "[encoders.events]" in said  # schema --infer
    assert "converted/part-00000.tfrecord.gz: 2 records" in said
    assert "stopped" in log
    assert list((tmp_path / "tfrecordd-directory/shards/clicks").glob("dt=2026-11-27/hour=10/*.gz"))
