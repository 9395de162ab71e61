"""The encode worker processes: answers in order, errors carried back, a dead worker reported,
no worker left behind, and each worker fed ahead (it holds the next batch while it encodes)."""

from __future__ import annotations

import io
import mmap
import os
import pickle
import random
import signal
import threading
from typing import Any

import anyio
import pytest

from tfrecordd.errors import WorkerError
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import Packed, unpack
from tfrecordd.pipeline.encoding import EncodeRequest, Outcome, encode, encode_events
from tfrecordd.pipeline.workerio import (
    DEPTH,
    SLOT_BYTES,
    frame,
    pickle_out_of_band,
    pickled_error,
    read_request,
    receive_exactly,
    send_all,
)
from tfrecordd.pipeline.workers import EncodeWorkers
from tfrecordd.plugin import Lines, RawEvent
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

pytestmark = pytest.mark.anyio

CONFIG = ExampleEncoderConfig.model_validate({"features": {"id": "int64"}})


def _lines(first: int, n: int) -> Lines:
    data = b"".join(b'{"id": %d}\n' % i for i in range(first, first + n))
    return Lines(data, "f.jsonl", 0, 1 << 20)


def _ids(outcome: Outcome) -> list[bytes]:
    # Small batches come back framed (an uncompressed unit), to be compressed by the shard.
    records = outcome.records
    assert isinstance(records, Packed)
    assert records.unit.compression is Compression.NONE
    return unpack(records)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone as far as work goes.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _request(
    lines: Lines | None, name: str = "e", events: list[RawEvent] | None = None
) -> EncodeRequest:
    return EncodeRequest(name, events or [], lines, Compression.NONE, None)


async def _call(pool: EncodeWorkers, lines: Lines, name: str = "e") -> Outcome:
    return await pool.call(_request(lines, name))


async def test_answers_come_back_to_their_own_batches() -> None:
    pool = EncodeWorkers(2, {"e": CONFIG})
    results: dict[int, Outcome] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)

        async def one(k: int) -> None:
            results[k] = await _call(pool, _lines(k * 100, 1 + k % 7))

        async with anyio.create_task_group() as calls:
            for k in range(40):
                calls.start_soon(one, k)
        tg.cancel_scope.cancel()
    encoder = CONFIG.build()
    for k, outcome in results.items():
        expected = encode_events(encoder, [], _lines(k * 100, 1 + k % 7), Compression.NONE, None)
        assert _ids(outcome) == _ids(expected)
        assert outcome.line_events == 1 + k % 7
    assert len(results) == 40


async def test_batches_sent_together_come_back_each_to_its_own() -> None:
    pool = EncodeWorkers(2, {"e": CONFIG})
    events = [RawEvent(b'{"id": %d}' % i, f"x:{i}") for i in range(5)]
    requests = [_request(_lines(k * 100, 1 + k)) for k in range(5)]
    requests.insert(2, _request(None, events=events))
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        outcomes = await pool.call_many(requests)
        tg.cancel_scope.cancel()
    encoder = CONFIG.build()
    expected = [
        encode_events(encoder, [], _lines(k * 100, 1 + k), Compression.NONE, None) for k in range(5)
    ]
    expected.insert(2, encode_events(encoder, events, None, Compression.NONE, None))
    assert [_ids(o) for o in outcomes] == [_ids(e) for e in expected]
    assert [o.line_events for o in outcomes] == [1, 2, 0, 3, 4, 5]


async def test_each_worker_is_fed_ahead() -> None:
    pool = EncodeWorkers(2, {"e": CONFIG})
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        # Stopped, the workers answer nothing: what is queued stays queued, however slowly the
        # calls are made (a loaded machine).
        for w in pool.workers:
            os.kill(w.process.pid, signal.SIGSTOP)
        done: list[int] = []

        async def call(k: int) -> None:
            await _call(pool, _lines(k, 20_000))
            done.append(k)

        try:
            async with anyio.create_task_group() as calls:
                for k in range(2 * DEPTH + 1):
                    calls.start_soon(call, k)
                # Each worker holds DEPTH batches at once; the one call more waits for room.
                with anyio.fail_after(10):
                    while sum(len(w.pending) for w in pool.workers) < 2 * DEPTH:
                        await anyio.sleep(0.001)
                await anyio.sleep(0.1)
                assert [len(w.pending) for w in pool.workers] == [DEPTH, DEPTH]
                assert DEPTH > 1  # the next batch waits in the pipe while one is encoded
                for w in pool.workers:
                    os.kill(w.process.pid, signal.SIGCONT)
        finally:
            for w in pool.workers:
                os.kill(w.process.pid, signal.SIGCONT)
        assert sorted(done) == list(range(2 * DEPTH + 1))
        tg.cancel_scope.cancel()


async def test_a_place_is_reserved_before_the_requests_are_made_and_freed_unused() -> None:
    # The encode stage reserves a place, then takes the batches waiting: while every place is
    # taken it waits (and batches gather), and a place given back unused is one again.
    started = threading.Event()
    go = threading.Event()

    def local(requests: list[EncodeRequest]) -> list[Outcome]:
        started.set()
        go.wait(10)
        return [encode(r, CONFIG.build()) for r in requests]

    pool = EncodeWorkers(1, {"e": CONFIG}, local=local)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        (worker,) = pool.workers
        os.kill(worker.process.pid, signal.SIGSTOP)
        try:
            places = [await pool.reserve() for _ in range(1 + DEPTH)]
            assert places == [None] + [worker] * DEPTH
            assert worker.reserved == DEPTH
            with anyio.move_on_after(0.2) as waited:
                await pool.reserve()
            assert waited.cancelled_caught  # every place taken: it waits
            await pool.release(places[1])
            with anyio.fail_after(5):
                assert await pool.reserve() is worker  # the place given back
            calls = [pool.call_on(p, [_request(_lines(10 * k, 2))]) for k, p in enumerate(places)]
            results: list[list[Outcome]] = []

            async def call(k: int) -> None:
                results.append(await calls[k])

            async with anyio.create_task_group() as running:
                for k in range(len(calls)):
                    running.start_soon(call, k)
                with anyio.fail_after(10):
                    while not started.is_set() or len(worker.pending) < DEPTH:
                        await anyio.sleep(0.001)
                assert worker.reserved == 0
                os.kill(worker.process.pid, signal.SIGCONT)
                go.set()
        finally:
            os.kill(worker.process.pid, signal.SIGCONT)
            go.set()
        assert sorted(_ids(r[0]) for r in results) == sorted(
            _ids(encode(_request(_lines(10 * k, 2)), CONFIG.build())) for k in range(len(calls))
        )
        with anyio.fail_after(5):
            assert await pool.reserve() is None  # the local thread free again
        tg.cancel_scope.cancel()


async def test_an_encoder_error_is_raised_in_the_daemon() -> None:
    pool = EncodeWorkers(1, {"e": CONFIG})
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        with pytest.raises(KeyError):
            await _call(pool, _lines(0, 3), name="missing")
        # The worker goes on.
        assert len(_ids(await _call(pool, _lines(0, 3)))) == 3
        tg.cancel_scope.cancel()


async def _kill_one_and_call(pool: EncodeWorkers) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        pool.workers[0].process.kill()
        async with anyio.create_task_group() as calls:
            for k in range(10):
                calls.start_soon(_call, pool, _lines(k, 5000))


async def test_a_killed_worker_fails_the_pool_instead_of_hanging() -> None:
    pool = EncodeWorkers(2, {"e": CONFIG})
    with anyio.fail_after(20), pytest.raises(BaseExceptionGroup) as caught:
        await _kill_one_and_call(pool)
    assert caught.group_contains(WorkerError, match="exited")


async def test_workers_stop_with_the_pool_and_ignore_a_terminal_ctrl_c() -> None:
    pool = EncodeWorkers(2, {"e": CONFIG})
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        pids = [w.process.pid for w in pool.workers]
        # Each leads a session of its own: a terminal's Ctrl-C (sent to the daemon's process
        # group) does not reach it.
        assert [os.getsid(pid) for pid in pids] == pids
        assert all(os.getpgid(pid) != os.getpgid(0) for pid in pids)
        for pid in pids:
            os.kill(pid, signal.SIGINT)
            os.kill(pid, signal.SIGTERM)
        assert len(_ids(await _call(pool, _lines(0, 10)))) == 10
        tg.cancel_scope.cancel()
    assert not any(_alive(pid) for pid in pids)


async def test_events_sent_one_by_one_travel_too() -> None:
    pool = EncodeWorkers(1, {"e": CONFIG})
    events = [RawEvent(b'{"id": 1}', "a"), RawEvent(b"{", "b")]
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        outcome = await pool.call(_request(None, events=events))
        tg.cancel_scope.cancel()
    assert len(_ids(outcome)) == 1
    assert [(i, reason) for i, reason, _ in outcome.failures] == [(1, "malformed")]


def test_lines_cross_to_a_worker_out_of_band_and_unchanged() -> None:
    lines = _lines(0, 50)
    for protocol in (4, 5):
        assert pickle.loads(pickle.dumps(lines, protocol)) == lines
    body, buffers = pickle_out_of_band([_request(lines), _request(None)])
    # The lines' bytes are sent as the very object the batch holds, not copied into the pickle.
    assert buffers == [lines.data]
    assert buffers[0] is lines.data
    assert len(body) < 500
    parts = frame(body, buffers, -1)
    got = read_request(io.BytesIO(b"".join(parts)))
    assert got is not None
    assert pickle.loads(got[0], buffers=got[1])[0].lines == lines
    assert read_request(io.BytesIO(b"".join(parts)[:-1])) is None


def test_lines_in_a_shared_slot_are_read_from_it_not_from_the_pipe() -> None:
    first, second = _lines(0, 20), _lines(100, 30)
    body, buffers = pickle_out_of_band([_request(first), _request(second)])
    area = mmap.mmap(-1, DEPTH * SLOT_BYTES)
    at = SLOT_BYTES  # slot 1
    for buffer in buffers:
        area[at : at + len(buffer)] = buffer
        at += len(buffer)
    parts = frame(body, buffers, 1)
    # Only the header and the pickle cross the pipe.
    assert len(parts) == 2
    stream = io.BytesIO(b"".join(parts) + b"next")
    got = read_request(stream, area)
    assert got is not None
    decoded = pickle.loads(got[0], buffers=got[1])
    assert [d.lines for d in decoded] == [first, second]
    assert stream.read() == b"next"
    with pytest.raises(WorkerError, match="shared memory"):
        read_request(io.BytesIO(b"".join(parts)))


async def test_a_request_too_large_for_a_slot_crosses_the_pipe() -> None:
    # Longer lines than a slot holds, in one request, beside small ones that use the slots.
    big = Lines(
        b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * 1000) for i in range(9000)),
        "big.jsonl",
        0,
        1 << 20,
    )
    assert len(big.data) > SLOT_BYTES
    async with anyio.create_task_group() as tg:
        pool = EncodeWorkers(1, {"e": CONFIG})
        await tg.start(pool.run)
        # The worker has the daemon's shared area mapped.
        (worker,) = pool.workers
        maps = await anyio.Path(f"/proc/{worker.process.pid}/maps").read_text()
        assert "memfd:tfrecordd-requests" in maps
        with anyio.fail_after(60):
            small = [await _call(pool, _lines(i * 10, 10)) for i in range(3)]
            outcome = await _call(pool, big)
            after = await _call(pool, _lines(5, 1))
        tg.cancel_scope.cancel()
    assert [len(_ids(o)) for o in small] == [10, 10, 10]
    # Packed (it is large), and the very bytes this process encodes from the same lines.
    local = encode_events(CONFIG.build(), [], big, Compression.NONE, None)
    assert isinstance(outcome.records, Packed)
    assert isinstance(local.records, Packed)
    assert outcome.records.records == 9000
    assert outcome.records.unit.data == local.records.unit.data
    assert len(_ids(after)) == 1


async def test_pipe_writes_resume_where_the_pipe_filled_and_reads_take_what_was_asked() -> None:
    # A pipe of Linux's default 64 KiB: the parts (several times that) go out in many writes,
    # each resumed mid-part, while the reader takes them in pieces of its own sizes.
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    rng = random.Random(3)
    parts = [rng.randbytes(n) for n in (5, 0, 200_000, 70_001, 1, 130_000)]
    whole = b"".join(parts)
    got: list[bytearray] = []
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_all, w, parts)
                for n in (3, 100_000, 1, len(whole) - 100_004):
                    await anyio.sleep(0.001)
                    got.append(await receive_exactly(r, n))
        assert b"".join(got) == whole
        os.close(w)
        w = -1
        with pytest.raises(EOFError):
            await receive_exactly(r, 1)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_an_error_that_does_not_pickle_arrives_as_text() -> None:
    class Unpicklable(Exception):
        def __reduce__(self) -> Any:
            raise TypeError("no")

    answer = pickle.loads(pickled_error(Unpicklable("bad value")))
    assert isinstance(answer, WorkerError)
    assert "Unpicklable: bad value" in str(answer)


async def test_without_shared_memory_requests_cross_the_pipe(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As under a seccomp filter or a kernel that refuses memfds: a warning, and the same answers.
    def refused(name: str, flags: int = 0) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "memfd_create", refused)
    async with anyio.create_task_group() as tg:
        pool = EncodeWorkers(2, {"e": CONFIG})
        await tg.start(pool.run)
        with anyio.fail_after(60):
            outcomes = [await _call(pool, _lines(i * 7, 7)) for i in range(2 * DEPTH + 1)]
        tg.cancel_scope.cancel()
    assert [len(_ids(o)) for o in outcomes] == [7] * (2 * DEPTH + 1)
    assert "no shared memory" in caplog.text


class _LocalEncoder:
    """The daemon's own encoder as the runtime gives it to the pool, recording what it took and
    holding each call until told (so that requests pile up while it is busy)."""

    def __init__(self) -> None:
        self.encoder = CONFIG.build()
        self.took: list[int] = []
        self.release = threading.Event()

    def __call__(self, requests: list[EncodeRequest]) -> list[Outcome]:
        self.release.wait(10)
        self.took.extend(r.lines.offset for r in requests if r.lines is not None)
        return [encode(r, self.encoder) for r in requests]


async def test_the_local_encoder_takes_requests_while_free_and_workers_the_rest() -> None:
    local = _LocalEncoder()
    pool = EncodeWorkers(1, {"e": CONFIG}, local=local)
    results: dict[int, Outcome] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)

        async def one(k: int) -> None:
            results[k] = await _call(pool, Lines(_lines(k * 10, 3).data, "f", k, 1 << 20))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as calls:
                for k in range(12):
                    calls.start_soon(one, k)
                    await anyio.sleep(0.01)
                # The first request went to the free local encoder, which is held: the worker
                # process answers the others meanwhile.
                while len(results) < 11:
                    await anyio.sleep(0.01)
                assert 0 not in results
                local.release.set()
        tg.cancel_scope.cancel()
    encoder = CONFIG.build()
    for k, outcome in results.items():
        expected = encode_events(encoder, [], _lines(k * 10, 3), Compression.NONE, None)
        assert _ids(outcome) == _ids(expected)
    assert len(results) == 12
    assert 0 in local.took
    assert 0 < len(local.took) < 12  # both kinds of encoder did some


async def test_local_encoder_alone_and_its_errors() -> None:
    def failing(requests: list[EncodeRequest]) -> list[Outcome]:
        raise ValueError("bad plan")

    local = _LocalEncoder()
    local.release.set()
    async with anyio.create_task_group() as tg:
        pool = EncodeWorkers(0, {"e": CONFIG}, local=local)
        await tg.start(pool.run)
        with anyio.fail_after(30):
            outcomes = [await _call(pool, _lines(k, 2)) for k in range(3)]
        assert [len(_ids(o)) for o in outcomes] == [2, 2, 2]
        pool = EncodeWorkers(0, {"e": CONFIG}, local=failing)
        await tg.start(pool.run)
        with pytest.raises(ValueError, match="bad plan"):
            await _call(pool, _lines(0, 1))
        tg.cancel_scope.cancel()
    with pytest.raises(ValueError, match="no worker process and no local encoder"):
        EncodeWorkers(0, {"e": CONFIG})
