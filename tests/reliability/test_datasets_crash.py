"""Kills with two datasets: one spool source routed by ``type``, clicks in folders by event hour
across a daylight-saving change (Europe/Berlin, 2026-10-25) and by country with completion
markers, impressions unpartitioned in a shard kept open across the clicks' commits.

Beyond exactly once, checked: each record in its dataset and folder (worked out from its ``ts``
with zoneinfo, not by tfrecordd), every marker listing exactly its partition's shards, and, at
the instant of each kill, every acknowledged spool file's records in published shards (a record
durable in a kept-open shard is not enough). Default: 30 kills; ``--run-slow``: 300 (the same as
``python scripts/crash_harness.py --datasets --kills 300``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.reliability.harness import (
    CRASH_PHASES,
    DATASETS,
    AckAudit,
    DatasetAudit,
    DatasetProducer,
    Figures,
    ShardIndex,
    audit_datasets,
    clean_run,
    datasets_config,
    dead_letter_entries,
    dead_letter_place,
    markers_present,
    run_dataset_trials,
)
from tests.support import DaemonProcess, GlobOracle, crash_cases, spool_drained


def check_audit(a: DatasetAudit | None, notes: list[str]) -> None:
    assert a is not None
    assert (a.lost, a.duplicated, a.unexpected, a.misplaced) == (0, 0, 0, 0), a.problems[:10]
    assert a.late == 0, "records on time when first read are never late after a restart"
    assert a.acked_unpublished == 0, a.problems[:10]
    assert a.dead_letters_duplicated == 0, "recovery cuts off the dead letters no commit covers"
    assert a.problems == [], a.problems[:10]
    assert a.verify_exit == 0
    assert not notes, notes


def check(figs: Figures, kills: int) -> None:
    print(figs.summary())
    a = figs.audit
    assert isinstance(a, DatasetAudit)
    check_audit(a, figs.notes)
    assert figs.kills == kills
    assert figs.glob_looks == kills + 1
    assert figs.dead_letters_missing == 0, "every unrouted and malformed event is dead-lettered"
    assert figs.phases_missed == [], figs.summary()
    assert set(figs.phases) == set(CRASH_PHASES["datasets"])
    assert figs.killed_before_ready > 0, figs.summary()
    # Restarts found shards kept open by a commit (finished at their journalled prefix), and
    # acknowledged files were checked after the kills.
    assert figs.recovered_finished > 0, figs.summary()
    assert a.acked_files > kills, figs.summary()
    # The clicks crossed hours, the repeated one included, and each closed hour got its marker.
    assert a.markers >= 4, figs.summary()


def test_sigkill_two_datasets_partitioned(tmp_path: Path) -> None:
    figs = run_dataset_trials(tmp_path, kills=30, seed=1)
    check(figs, 30)
    hours = markers_present(tmp_path / "clicks")
    assert {"dt=2026-10-25/hour=02", "dt=2026-10-25/hour=02+0100"} <= hours


def test_sigkill_events_out_of_order_with_a_short_lateness(tmp_path: Path) -> None:
    """Events dated up to two hours early, two hours of allowed lateness, an hour every 720
    events, shards large enough that cuts come by age: no event is late when first read, each
    batch touches several hours, partitions close while records of older hours are in flight,
    and none of them may be late after any kill. (A state file that keeps a line no commit
    covers is caught by ``adversarial/test_completion_model.py``, every run; here it was not, in
    three: its window, from the save to the covering commit's intent, is milliseconds.)"""
    big = {"max_shard_records": 5000, "max_open_shards": 64}
    figs = run_dataset_trials(
        tmp_path,
        kills=30,
        seed=5,
        step=5,
        disorder=7200,
        datasets={"clicks": big, "impressions": big},
    )
    check(figs, 30)
    assert len(markers_present(tmp_path / "clicks")) >= 20, figs.summary()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_two_datasets_partitioned_long(tmp_path: Path) -> None:
    figs = run_dataset_trials(tmp_path, kills=300, seed=3, compression="gzip")
    check(figs, 300)


# -- one named crash point at a time ----------------------------------------------------------

FILES, PER_FILE = 12, 50
STEP = 24.0
"""Seconds of event time between events: the 600 events span four hours, so the watermark
closes three of them (markers) while the first daemon runs."""


def _spool(root: Path) -> DatasetProducer:
    producer = DatasetProducer(root / "spool", batch=PER_FILE, step=STEP)
    (root / "spool").mkdir(parents=True, exist_ok=True)
    for _ in range(FILES):
        producer.write_batch()
    return producer


def _finish(root: Path, producer: DatasetProducer, acks: AckAudit) -> DatasetAudit:
    """A clean daemon drains the spool; another closes every partition; the audit."""
    oracles = [GlobOracle(root / d) for d in DATASETS]
    figs = Figures("datasets", "gzip")
    clean_run(
        datasets_config(root, "gzip", lateness="0s"),
        figs,
        lambda: spool_drained(root / "spool"),
        60,
    )
    hours = producer.click_hours()
    clean_run(
        datasets_config(root, "gzip", lateness="0s", closing=True),
        figs,
        lambda: hours <= markers_present(root / "clicks"),
        60,
    )
    a = audit_datasets(root, producer, acks, oracles, verify=False)
    check_audit(a, figs.notes)
    places = {dead_letter_place(d["where"]) for d in dead_letter_entries(root / "state")}
    assert producer.unrouted | producer.bad <= places, "every unrouted and malformed event"
    return a


@pytest.mark.parametrize(("point", "nth"), crash_cases(CRASH_PHASES["datasets"]))
def test_a_crash_point_with_two_datasets_then_restart(tmp_path: Path, point: str, nth: int) -> None:
    """Killed at a named point of the first run over four hours of events (three of them closed
    by the watermark, so ``after-marker`` is reached): at that instant every acknowledged file's
    records are published; after a restart, each record once, in its place, and the markers."""
    producer = _spool(tmp_path)
    cfg = datasets_config(tmp_path, "gzip", lateness="0s")
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"{point}:{nth}"})
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()
    acks = AckAudit(tmp_path / "state")
    index = ShardIndex({name: tmp_path / name for name in DATASETS})
    acks.look(producer.written(), tmp_path / "spool", index, f"after {point}:{nth}")
    assert acks.unpublished == 0, acks.problems
    _finish(tmp_path, producer, acks)


def test_a_batch_is_acknowledged_only_once_every_shard_holding_it_is_published(
    tmp_path: Path,
) -> None:
    """Impressions stay in a shard open for two seconds while the clicks' shards rotate (each
    rotation a commit): a spool file seen gone at any instant must have every record published,
    its impressions included."""
    producer = _spool(tmp_path)
    cfg = datasets_config(
        tmp_path,
        "none",
        lateness="0s",
        datasets={"impressions": {"max_shard_records": 0, "max_shard_age": "2s"}},
    )
    acks = AckAudit(tmp_path / "state")
    index = ShardIndex({name: tmp_path / name for name in DATASETS})
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        deadline = time.monotonic() + 60
        while acks.files < FILES and time.monotonic() < deadline:
            acks.look(producer.written(), tmp_path / "spool", index, "while running")
            time.sleep(0.01)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert acks.files == FILES
    assert acks.unpublished == 0, acks.problems[:5]
