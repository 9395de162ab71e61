"""Each source's tokens carry a version: written by every batch, kept through the journal's
compaction, checked where tokens come back (``recover``, ``ack``, ``fold``). A token of a newer
tfrecordd is refused with an error naming the source and what to do, never misread; tokens of
today's shape without a version (already in journals on disk) are still read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tfrecordd.errors import TfrecorddError, TokenVersionError
from tfrecordd.fsys import LOCAL
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import ShardRef
from tfrecordd_plugins.sources.directory import DirectorySource, DirectorySourceConfig
from tfrecordd_plugins.sources.redis_stream import RedisStreamSource, RedisStreamSourceConfig
from tfrecordd_plugins.sources.socket import TcpSourceConfig
from tfrecordd_plugins.sources.spool_positions import token

pytestmark = pytest.mark.anyio

FUTURE_SPOOL = {"v": 3, "f": "node/0001-a.jsonl", "o": 7, "eof": False}
FUTURE_REDIS = {"v": 2, "r": ["1-0"]}


def _spool(tmp_path: Path) -> DirectorySource:
    spool = tmp_path / "spool"
    spool.mkdir()
    config = DirectorySourceConfig(name="inbox", type="directory", path=spool, encoder="e")
    return config.build()


def _redis() -> RedisStreamSource:
    # Nothing listens on port 1: a source that tried to reach Redis would retry until the
    # time limit below, so the refusal is seen to come first.
    config = RedisStreamSourceConfig(
        name="events", type="redis-stream", url="redis://127.0.0.1:1/0", stream="s", encoder="e"
    )
    return config.build()


def _refused(error: pytest.ExceptionInfo[TokenVersionError], source: str, version: int = 2) -> None:
    message = str(error.value)
    assert isinstance(error.value, TfrecorddError)
    assert source in message
    assert f"version {version}" in message
    assert "newer tfrecordd" in message
    assert "run the tfrecordd version that wrote the state_dir" in message


def test_spool_tokens_carry_their_version_and_old_ones_read_the_same() -> None:
    assert token("node/0001-a.jsonl", 7, False)["v"] == 1
    old = {"f": "node/0001-a.jsonl", "o": 7, "eof": False}
    assert DirectorySource.fold(None, [old]) == DirectorySource.fold(None, [token(**_args(old))])


def _args(t: dict[str, Any]) -> dict[str, Any]:
    return {"claim": t["f"], "offset": t["o"], "eof": t["eof"]}


async def test_an_old_spool_token_recovers(tmp_path: Path) -> None:
    source = _spool(tmp_path)
    try:
        await source.recover(None, [{"f": "node/0001-a.jsonl", "o": 7, "eof": False}])
        assert source.positions.start("node/0001-a.jsonl") == 7
    finally:
        await source.aclose()


async def test_a_future_spool_token_is_refused_by_recover_ack_and_fold(tmp_path: Path) -> None:
    source = _spool(tmp_path)
    try:
        with pytest.raises(TokenVersionError) as error:
            await source.recover(None, [FUTURE_SPOOL])
        _refused(error, "'inbox' (directory)", 3)
        assert source.positions.committed == {}, "nothing read from it"
        with pytest.raises(TokenVersionError) as error:
            await source.ack([token("node/0001-a.jsonl", 3, False), FUTURE_SPOOL])
        _refused(error, "'inbox' (directory)", 3)
        assert source.positions.committed == {}, "checked before any token is acted on"
    finally:
        await source.aclose()
    with pytest.raises(TokenVersionError) as error:
        DirectorySource.fold(None, [FUTURE_SPOOL])
    _refused(error, "directory", 3)


@pytest.mark.parametrize("version", ["2", 0, None, True, 1.5])
def test_a_token_whose_version_is_no_version_is_refused(version: object) -> None:
    with pytest.raises(TokenVersionError) as error:
        DirectorySource.fold(None, [{**FUTURE_SPOOL, "v": version}])
    message = str(error.value)
    assert "no valid version" in message, message
    assert "tfrecordd state check" in message, message
    assert "newer tfrecordd" not in message, "damage is not taken for a newer release"


async def test_a_future_redis_token_is_refused_before_redis_is_asked() -> None:
    source = _redis()
    try:
        with anyio.fail_after(5):
            with pytest.raises(TokenVersionError) as error:
                await source.recover(None, [FUTURE_REDIS])
            _refused(error, "'events' (redis-stream)")
            with pytest.raises(TokenVersionError) as error:
                await source.ack([{"v": 1, "r": ["1-0"]}, FUTURE_REDIS])
            _refused(error, "'events' (redis-stream)")
            # An older release's list token never reached the closed port either way: an empty
            # list acks nothing.
            await source.recover(None, [[]])
    finally:
        await source.aclose()
    for call in (RedisStreamSource.fold, lambda _, t: RedisStreamSource.compact(list(t))):
        with pytest.raises(TokenVersionError) as error:
            call(None, [FUTURE_REDIS])
        _refused(error, "redis-stream")


def test_redis_tokens_carry_their_version_through_compaction() -> None:
    old = [["1-0", "1-1"], [["1-2", "1-5"]]]
    merged = RedisStreamSource.compact(old)
    assert merged == [{"v": 1, "r": [["1-0", "1-5"]]}]
    assert RedisStreamSource.compact(merged) == merged
    assert RedisStreamSource.fold(None, merged) == RedisStreamSource.fold(None, old)


async def test_a_future_socket_token_is_refused_by_ack() -> None:
    config = TcpSourceConfig(name="feed", type="tcp", listen="127.0.0.1:0", encoder="e", ack=True)
    source = config.build()
    try:
        await source.ack([{"c": 99, "n": 1}, {"v": 1, "c": 99, "n": 2}])
        with pytest.raises(TokenVersionError) as error:
            await source.ack([{"v": 2, "c": 99, "n": 3}])
        _refused(error, "'feed' (tcp)")
    finally:
        await source.aclose()


def test_the_journal_keeps_token_versions_and_refuses_a_future_one(tmp_path: Path) -> None:
    folds = {"spool": DirectorySource.fold}
    state = tmp_path / "state"
    j = Journal(str(state), LOCAL, folds=folds)
    j.recover()
    finished = j.next_intent(
        {"spool": [token("node/0001-a.jsonl", 5, False)]}, [ShardRef("", "s1")]
    )
    j.write_intent(finished)
    j.write_done(finished.seq)
    j.write_intent(
        j.next_intent({"spool": [token("node/0001-a.jsonl", 9, False)]}, [ShardRef("", "s2")])
    )
    j.compact()
    j.close()
    j = Journal(str(state), LOCAL, folds=folds)
    rec = j.recover()
    assert rec.states == {"spool": {"node/0001-a.jsonl": 5}}
    assert rec.unfinished[0].positions == {"spool": [token("node/0001-a.jsonl", 9, False)]}
    assert rec.unfinished[0].positions["spool"][0]["v"] == 1
    j.close()
    # A finished commit of a newer tfrecordd (written here with no fold for the source, as a
    # journal keeps an unconfigured source's tokens): folded at start-up, and refused.
    j = Journal(str(state), LOCAL, folds={})
    j.recover()
    done = j.next_intent({"spool": [FUTURE_SPOOL]}, [ShardRef("", "s3")])
    j.write_intent(done)
    j.write_done(done.seq)
    j.close()
    with pytest.raises(TokenVersionError) as error:
        Journal(str(state), LOCAL, folds=folds).recover()
    _refused(error, "directory", 3)


def test_spool_tokens_an_earlier_release_would_misread_are_version_2() -> None:
    """A token that stops before a last line without its line end, or names a claim renamed to
    be read on from an offset: a release before them would finish the file (losing the line)
    or read the claim from byte 0 (repeating lines), so they are version 2, which it refuses.
    Every other spool token stays version 1."""
    assert token("node/0001-a.jsonl", 7, True, seen=(7, 1, 2))["v"] == 1
    assert token("node/0001-a.jsonl", 7, True, seen=(9, 1, 2), part=True)["v"] == 2
    assert token("node/0001@5~7.2a-a.jsonl", 7, False)["v"] == 2
