"""A dataset's completion state against the commits that justify it: generated sequences of
records seen (in any order of hours), partitions opened, watermarks moved, cuts, commits made
durable in order, markers published, and crashes at any step.

The promise (DESIGN: nothing the daemon persists runs ahead of the commit it depends on): after
a crash, the state file holds a watermark and a closed line no later than those of the last
commit whose intent was durable. Records read after that commit replay, and a line taken from
records no commit covered would close their partitions under them: on time when first read,
late after the restart. Every partition that may hold shards stays pending until its marker is
published.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.support import CI_DERANDOMIZED, examples, hour_folder, write_datasets_config
from tfrecordd.config import load_config
from tfrecordd.fsys import LOCAL
from tfrecordd.metrics import Metrics
from tfrecordd.outputs import make_output
from tfrecordd.pipeline.completion import Completion
from tfrecordd.pipeline.datasets import completions

T0 = 1_790_000_000 - 1_790_000_000 % 3600
"""An hour boundary in the past (2026-09): the watermark never passes the clock."""

Line = tuple[float | None, float]


def _no_later(state: Line, durable: Line) -> bool:
    watermark, closed = state
    if durable[0] is None:
        return watermark is None and closed == float("-inf")
    return (watermark is None or watermark <= durable[0]) and closed <= durable[1]


class CompletionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="completion-model-"))
        self.completion: Completion | None = None
        self.cuts: list[Line] = []
        """Cut and not yet durable, oldest first (commits become durable in order)."""
        self.durable: Line = (None, float("-inf"))
        self.opened: set[str] = set()
        """Every time partition opened and not yet marked."""
        self.ends: dict[str, float] = {}
        """Each partition's end."""

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _load(self) -> Completion:
        cfg = load_config(self.config)
        outputs = {"ev": make_output(cfg, LOCAL, Metrics(), "ev")}
        os.makedirs(outputs["ev"].staging_dir, exist_ok=True)  # as the daemon's start makes it
        return completions(cfg, outputs, str(self.root / "state"), LOCAL)["ev"]

    @initialize(lateness=st.sampled_from(["0s", "20m", "90m"]))
    def start(self, lateness: str) -> None:
        self.config = write_datasets_config(
            self.root,
            {
                "ev": {
                    "encoder": "ev",
                    "compression": "none",
                    "partition": {"time": "event", "time_field": "ts"},
                    "completion": {"allowed_lateness": lateness, "idle_close": "10m"},
                }
            },
            encoders={"ev": {"ts": {"type": "int64", "time_unit": "s"}}},
            sources=[{"name": "in", "dataset": "ev"}],
        )
        self.completion = self._load()

    @rule(hour=st.integers(0, 8), second=st.integers(0, 3599))
    def record(self, hour: int, second: int) -> None:
        """A record of this time is written: its partition opened first if new, as the write
        stage does. A record of a closed partition would be late: the write stage refuses it."""
        c = self.completion
        assert c is not None
        t = float(T0 + hour * 3600 + second)
        folder = hour_folder(t, "UTC")
        self.ends[folder] = float(T0 + (hour + 1) * 3600)
        if c.late(folder):
            return
        c.opening(folder)
        (self.root / "ev" / folder).mkdir(parents=True, exist_ok=True)  # its shard's folder
        self.opened.add(folder)
        c.saw((t, t))

    @rule()
    def close(self) -> None:
        """The write stage's turn: partitions the line passed are closed, their markers to come
        with the next cut's commit."""
        c = self.completion
        assert c is not None
        for prefix in c.due():
            c.scheduled.add(prefix)

    @rule()
    def cut(self) -> None:
        c = self.completion
        assert c is not None
        self.cuts.append(c.at_cut())

    @rule()
    def commit(self) -> None:
        """The oldest cut's intent is durable; the markers of the partitions its line closed
        are published."""
        c = self.completion
        assert c is not None
        if not self.cuts:
            return
        at = self.cuts.pop(0)
        c.committed(at)
        self.durable = at
        for prefix in sorted(c.scheduled):
            if self.ends[prefix] <= at[1]:
                c.mark(prefix)
                self.opened.discard(prefix)

    @rule()
    def crash(self) -> None:
        """Killed: what was cut and not durable is lost; the next start reads the state."""
        self.cuts.clear()
        self.completion = self._load()

    @invariant()
    def state_runs_no_later_than_the_last_durable_commit(self) -> None:
        if self.completion is None:
            return
        again = self._load()
        state = (again.watermark, again.closed_through)
        assert _no_later(state, self.durable), (state, self.durable)
        assert self.opened <= again.pending, self.opened - again.pending


CompletionMachine.TestCase.settings = settings(
    max_examples=examples(60, 600),
    derandomize=CI_DERANDOMIZED,
    stateful_step_count=30,
    deadline=None,
)
test_the_completion_state_against_its_commits = CompletionMachine.TestCase
