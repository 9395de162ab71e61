"""The benchmark suite runs in its tiny mode and writes well-formed results (no timing checked)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """A tiny run of the suite, without TensorFlow, which must succeed."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--no-tensorflow", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_quick_run_writes_well_formed_results(tmp_path: Path) -> None:
    proc = _bench("--out", tmp_path)
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {"cpu", "cores", "python", "tensorflow", "tfrecordd", "date"} <= set(data["machine"])
    rows = data["rows"]
    cases = {r["case"].split()[0] for r in rows}
    assert cases == {"1", "2", "3", "4", "5", "6", "7", "8"}
    for r in rows:
        # CPU time is read in clock ticks (10 ms): a tiny run can read none.
        assert r["ours"] > 0 or (r["unit"] == "ms" and r["ours"] == 0), r
        assert math.isfinite(r["ours"]), r
        if r["ratio"] is not None:
            assert math.isclose(r["ratio"], r["ours"] / r["baseline"]), r
        assert r["met"] in (True, False, None), r
    markdown = (tmp_path / "latest.md").read_text()
    assert markdown.count("\n| ") == len(rows) + 1
    assert "events/s" in proc.stdout


def test_a_partial_run_leaves_the_recorded_results_alone() -> None:
    """Only a full run replaces results/latest.*, the figures the README links to: a run of one
    case (to compare two trees, say) must not leave them holding that case alone."""
    recorded = ROOT / "benchmarks" / "results" / "latest.md"
    before = recorded.read_bytes()
    proc = _bench("--cases", "movies")
    assert "a partial run" in proc.stderr
    assert recorded.read_bytes() == before
