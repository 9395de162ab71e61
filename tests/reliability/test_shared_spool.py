"""Several daemons on one spool directory, SIGKILLed at random: each file goes to one of them.

Three ``tfrecordd run`` processes (node ids ``n0``..``n2``, a state directory each, one output
directory) read one spool while a producer keeps publishing files into it. Daemons are
SIGKILLed and restarted at random instants; at the end every daemon drains what it claimed and
the independent audit counts lost and duplicated events. Also here: a daemon upgraded in place
resumes the claims of the layout before node folders exactly once.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tests.reliability.harness import (
    SpoolProducer,
    audit,
    dead_letter_places,
)
from tests.support import (
    DaemonProcess,
    claimed_files,
    movie_event,
    run_clean_until,
    spool_drained,
    wait_for,
    write_config,
)
from tfrecordd.fsys import LOCAL
from tfrecordd.state.journal import Journal
from tfrecordd_plugins.sources.directory import CLAIM_DIR, DirectorySource

NODES = 3


def _configs(root: Path) -> list[Path]:
    spool, out = root / "spool", root / "shards"
    return [
        write_config(
            root / f"n{i}",
            daemon={
                "node_id": f"n{i}",
                "state_dir": root / f"n{i}" / "state",
                "max_batch_events": 10,
                "drain_timeout": "30s",
            },
            output={"dir": out, "max_shard_records": 50, "max_shard_age": "100ms"},
            source={"path": spool},
        )
        for i in range(NODES)
    ]


def run_shared_spool(
    root: Path, *, kills: int, seed: int, seconds: float, max_events: int = 20_000
) -> str:
    """Kill daemons at random while the producer writes, drain with every node, audit."""
    rng = random.Random(seed)
    spool = root / "spool"
    spool.mkdir(parents=True)
    configs = _configs(root)
    producer = SpoolProducer(spool, batch=100, interval=0.05, max_events=max_events)
    daemons = [DaemonProcess(cfg) for cfg in configs]
    producer.start()
    t0 = time.monotonic()
    done = 0
    try:
        for d in daemons:
            d.wait_started(60)
        gap = seconds / kills
        while done < kills:
            time.sleep(rng.uniform(0, 2 * gap))
            i = rng.randrange(NODES)
            daemons[i].kill()
            done += 1
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.5))  # down for a while: the others take its share
            daemons[i] = DaemonProcess(configs[i])
    finally:
        producer.stop()
        for d in daemons:
            d.kill()
    # Every node drains what it claimed (its own claims, which no other node may read).
    daemons = [DaemonProcess(cfg) for cfg in configs]
    try:
        for d in daemons:
            d.wait_started(60)
        wait_for(lambda: spool_drained(spool), timeout=120, interval=0.2)
        for d in daemons:
            assert d.stop(60) == 0, d.output()[-3000:]
    finally:
        for d in daemons:
            d.kill()
    found = audit(root / "shards", producer.ids)
    letters: set[str] = set()
    for i in range(NODES):
        letters |= dead_letter_places(root / f"n{i}" / "state")
    assert found.ok, found
    assert producer.bad <= letters, sorted(producer.bad - letters)[:5]
    assert len(producer.ids) > 1000, "the producer hardly ran"
    return (
        f"{NODES} daemons, {kills} SIGKILLs in {time.monotonic() - t0:.0f}s: {found.events} "
        f"events in {found.shards} shards, lost {found.lost}, duplicated {found.duplicated}"
    )


def test_three_daemons_share_a_spool_through_random_kills(tmp_path: Path) -> None:
    summary = run_shared_spool(tmp_path, kills=8, seed=17, seconds=12)
    print(summary)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_three_daemons_share_a_spool_through_many_kills(tmp_path: Path, seed: int) -> None:
    summary = run_shared_spool(tmp_path, kills=40, seed=seed, seconds=60, max_events=100_000)
    print(summary)


def _lines(first: int, n: int) -> list[bytes]:
    return [json.dumps(movie_event(i)).encode() + b"\n" for i in range(first, first + n)]


@pytest.mark.parametrize("killed", [False, True])
def test_claims_of_the_old_layout_resume_once_after_an_upgrade(
    tmp_path: Path, killed: bool
) -> None:
    """Before node folders, claims sat directly in ``.tfrecordd-claimed/`` and the journal kept
    their offsets under the bare claim name. An upgraded daemon adopts them and resumes each
    from its committed offset: nothing before it is written again, nothing after it is lost
    (also when it is killed right after adopting them)."""
    cfg = write_config(
        tmp_path, output={"max_shard_age": "100ms", "max_shard_records": 50}, daemon={}
    )
    claims = tmp_path / "spool" / CLAIM_DIR
    claims.mkdir()
    half = _lines(0, 200)
    committed = sum(map(len, half[:120]))  # events 0..119 were published before the upgrade
    (claims / f"{1:020d}-half.jsonl").write_bytes(b"".join(half))
    (claims / f"{2:020d}-fresh.jsonl").write_bytes(b"".join(_lines(1000, 80)))
    state = tmp_path / "state"
    journal = Journal(str(state), LOCAL, {"spool": DirectorySource.fold})
    journal.recover()
    intent = journal.next_intent(
        {"spool": [{"f": f"{1:020d}-half.jsonl", "o": committed, "eof": False}]}
    )
    journal.write_intent(intent)
    journal.write_done(intent.seq)
    journal.close()
    expected = set(range(120, 200)) | set(range(1000, 1080))

    def drained() -> bool:
        return not claimed_files(tmp_path / "spool")

    if killed:
        d = DaemonProcess(cfg)
        try:
            d.wait_started()
            wait_for(lambda: not any(p.is_file() for p in claims.iterdir()), timeout=10)
        finally:
            d.kill()
        assert not any(p.is_file() for p in claims.iterdir()), "adopted into the node folder"
    run_clean_until(cfg, drained)
    found = audit(tmp_path / "shards", expected)
    assert found.ok, found
