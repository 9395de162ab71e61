"""The encode stage: raw batches in, encoded batches out, in the order they came.

Batches already waiting go to an encoder together, up to :data:`GROUP_BATCHES`: a place in an
encoder is reserved first, and the group is taken then, so that the batches that come while
every encoder is busy join it. A routed or partitioned source's batches of one group are
encoded together, and joined into one (:mod:`~tfrecordd.pipeline.joining`). Each batch
becomes an :class:`~tfrecordd.pipeline.encoding.EncodeRequest` (its events known to be bad are
kept back for the dead letters) and each outcome an
:class:`~tfrecordd.pipeline.encoding.EncodedBatch`, by one code path whoever encodes:

- ``encode_workers = 1``: a whole group is encoded in a worker thread
  (:meth:`EncodeStage.encode_all`);
- ``encode_workers = N > 1``: the daemon's own encode thread and N - 1 worker processes
  (:class:`~tfrecordd.pipeline.workers.EncodeWorkers`) take groups at once; a slot per group,
  queued in arrival order, keeps their batches in order on the way out (offsets commit in order).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tfrecordd.metrics import Metrics
from tfrecordd.pipeline.encodeplan import EncodePlan
from tfrecordd.pipeline.encoding import (
    EncodedBatch,
    EncodeRequest,
    EventFailure,
    Outcome,
    Part,
)
from tfrecordd.pipeline.joining import encode_all
from tfrecordd.pipeline.routing import Target
from tfrecordd.pipeline.workerio import DEPTH
from tfrecordd.pipeline.workers import EncodeWorkers, Worker
from tfrecordd.plugin import Encoder, FailureReason, RawBatch, RawEvent

GROUP_BATCHES = 4
"""The most batches encoded in one trip to the encode thread or to a worker process (those
already waiting): fewer hand-offs when the pipeline is full, none held back when it is not."""

_T = TypeVar("_T")


def take_waiting(recv: MemoryObjectReceiveStream[_T], first: _T, limit: int) -> list[_T]:
    """``first`` and the items already waiting in ``recv`` behind it, up to ``limit`` in all."""
    items = [first]
    while len(items) < limit:
        try:
            items.append(recv.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
    return items


def _split_rejected(events: list[RawEvent]) -> tuple[list[RawEvent], list[RawEvent]]:
    good: list[RawEvent] = []
    rejected: list[RawEvent] = []
    for ev in events:
        (good if ev.error is None else rejected).append(ev)
    return good, rejected


def blank(batch: RawBatch) -> bool:
    """Whether encoding ``batch`` gives nothing: no events, and lines (if any) that are all
    empty or whitespace, none long enough to be refused. Such a batch (a storm of blank lines,
    a file's end) skips the trip to an encoder."""
    lines = batch.lines
    if batch.events or lines is None:
        return not batch.events
    return len(lines.data) <= lines.max_line and (not lines.data or lines.data.isspace())


@dataclass(frozen=True, slots=True)
class _Group:
    """Batches on their way through an encoder: each one's good and rejected events, and the
    requests made of those that have something to encode (``sent``: their indexes)."""

    batches: list[RawBatch]
    splits: list[tuple[list[RawEvent], list[RawEvent]]]
    sent: list[int]
    requests: list[EncodeRequest]


@dataclass(slots=True)
class _Slot:
    """One group's place in the encode stage's output order."""

    done: anyio.Event = field(default_factory=anyio.Event)
    results: list[EncodedBatch] = field(default_factory=list)


class EncodeStage:
    """Encodes the batches of every source as ``plan`` says: each with its dataset's encoder,
    routed and partitioned where its source's config asks for it."""

    def __init__(self, plan: EncodePlan, *, workers: int, metrics: Metrics) -> None:
        """``workers`` is ``encode_workers``."""
        self.plan = plan
        self.built: dict[str, Encoder | Target] = {n: b.build() for n, b in plan.builders.items()}
        self.workers = workers
        self.metrics = metrics

    def refusals(self, plan: EncodePlan, sources: Iterable[str]) -> list[str]:
        """Why the encoding of ``sources`` in ``plan`` cannot be taken while running: with
        encode worker processes, what they were started with cannot change."""
        if self.workers == 1:
            return []
        out = []
        for name in sources:
            key = plan.sources[name].target
            if self.plan.builders.get(key) != plan.builders[key]:
                out.append(
                    f"source {name}: its encoding differs from what the encode worker processes "
                    "were started with (encode_workers > 1); restart to change it"
                )
        return out

    def use(self, plan: EncodePlan, sources: Iterable[str], removed: Iterable[str]) -> None:
        """Encode ``sources`` as ``plan`` says from now on, and forget ``removed`` (a reload,
        once none of their batches is in the pipeline; :meth:`refusals` said none)."""
        for name in removed:
            self.plan.sources.pop(name, None)
        for name in sources:
            source = plan.sources[name]
            builder = plan.builders[source.target]
            if self.plan.builders.get(source.target) != builder:
                self.built[source.target] = builder.build()
                self.plan.builders[source.target] = builder
            self.plan.sources[name] = source

    async def run(
        self,
        recv: MemoryObjectReceiveStream[RawBatch],
        send: MemoryObjectSendStream[EncodedBatch],
    ) -> None:
        """Encode what ``recv`` brings into ``send``, until ``recv`` ends."""
        depth = self.metrics.stream_depth.labels("encode")
        async with recv, send:
            if self.workers == 1:
                async for batch in recv:
                    group = take_waiting(recv, batch, GROUP_BATCHES)
                    depth.set(recv.statistics().current_buffer_used)
                    if all(map(blank, group)):
                        encoded_group = self.encode_all(group)
                    else:
                        encoded_group = await anyio.to_thread.run_sync(self.encode_all, group)
                    for encoded in encoded_group:
                        await send.send(encoded)
                return
            pool = EncodeWorkers(self.workers - 1, self.plan.builders, local=self.encode_requests)
            order_send, order_recv = anyio.create_memory_object_stream[_Slot](self.workers * DEPTH)

            async def encode_group(
                batches: list[RawBatch], slot: _Slot, place: Worker | None
            ) -> None:
                group = self._group(batches)
                if group.requests:
                    outcomes = await pool.call_on(place, group.requests)
                else:
                    outcomes = []
                    await pool.release(place)
                slot.results = self._encoded(group, outcomes)
                slot.done.set()

            async def forward() -> None:
                async with order_recv:
                    async for slot in order_recv:
                        await slot.done.wait()
                        for result in slot.results:
                            await send.send(result)

            async with anyio.create_task_group() as workers_tg:
                await workers_tg.start(pool.run)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(forward)
                    async with order_send:
                        async for batch in recv:
                            # A place first, then the group: the batches that come while every
                            # encoder is busy join it (GROUP_BATCHES).
                            place = await pool.reserve()
                            batches = take_waiting(recv, batch, GROUP_BATCHES)
                            depth.set(recv.statistics().current_buffer_used)
                            slot = _Slot()
                            try:
                                await order_send.send(slot)
                            except BaseException:
                                with anyio.CancelScope(shield=True):
                                    await pool.release(place)
                                raise
                            tg.start_soon(encode_group, batches, slot, place)
                workers_tg.cancel_scope.cancel()

    def encode_all(self, batches: list[RawBatch]) -> list[EncodedBatch]:
        """Encode ``batches`` here and now (blocking: the encode thread's trip)."""
        group = self._group(batches)
        return self._encoded(group, self.encode_requests(group.requests))

    def encode_requests(self, requests: list[EncodeRequest]) -> list[Outcome]:
        """The daemon's own encoder: requests as a worker process takes them."""
        return encode_all(self.built.__getitem__, requests)

    def _group(self, batches: list[RawBatch]) -> _Group:
        splits = [_split_rejected(b.events) for b in batches]
        sent = [
            i
            for i, (b, (good, _)) in enumerate(zip(batches, splits, strict=True))
            if good or (b.lines is not None and not blank(b))
        ]
        plans = self.plan.sources
        arrival = time.time()
        requests = []
        for k, i in enumerate(sent):
            plan = plans[batches[i].source]
            # Joined batches become one (_join): none of another source may lie between.
            joins = k > 0 and all(b.source == batches[i].source for b in batches[sent[k - 1] : i])
            requests.append(
                EncodeRequest(
                    plan.target,
                    splits[i][0],
                    batches[i].lines,
                    plan.compression,
                    plan.level,
                    arrival,
                    joins,
                )
            )
        return _Group(batches, splits, sent, requests)

    def _encoded(self, group: _Group, outcomes: list[Outcome]) -> list[EncodedBatch]:
        by_batch: list[Outcome | None] = [None] * len(group.batches)
        for i, sent in zip(group.sent, outcomes, strict=True):
            by_batch[i] = sent
        out: list[EncodedBatch] = []
        lead = -1  # in out: the batch the next joined ones join
        for batch, (good, rejected), outcome in zip(
            group.batches, group.splits, by_batch, strict=True
        ):
            encoded = self._batch(batch, good, rejected, outcome)
            if outcome is not None and outcome.joined:
                # The batches between (none sent: blank, or only rejected events) join as well.
                out[lead] = _join([*out[lead:], encoded])
                del out[lead + 1 :]
                continue
            out.append(encoded)
            if outcome is not None:
                lead = len(out) - 1
        return out

    def _batch(
        self,
        batch: RawBatch,
        good: list[RawEvent],
        rejected: list[RawEvent],
        outcome: Outcome | None,
    ) -> EncodedBatch:
        """The batch for the writer: its records, and every failure with its event."""
        failures: list[EventFailure] = [
            (ev, FailureReason.REJECTED, ev.error or "") for ev in rejected
        ]
        parts: list[Part] = []
        events = len(batch.events)
        if outcome is not None:
            if outcome.parts is not None:
                parts = outcome.parts
                for (dataset, reason), n in outcome.fallbacks.items():
                    self.metrics.partition_fallbacks.labels(dataset, reason).inc(n)
            else:
                only = self.plan.sources[batch.source].dataset
                assert only is not None
                parts = [Part(only, "", outcome.records)]
            failures.extend((good[i], reason, detail) for i, reason, detail in outcome.failures)
            failures.extend(outcome.line_failures)
            if outcome.line_events:
                # Events sent as lines are counted here, where they were first split.
                self.metrics.events_received.labels(batch.source).inc(outcome.line_events)
                events += outcome.line_events
        return EncodedBatch(
            batch.source, [p for p in parts if p.count], batch.token, events, failures
        )


def _join(batches: list[EncodedBatch]) -> EncodedBatch:
    """Batches of one source as one: the first one's parts (which hold every one's records),
    every one's positions, events and failures in order."""
    first = batches[0]
    return EncodedBatch(
        first.source,
        first.parts,
        first.token,
        sum(b.events for b in batches),
        [f for b in batches for f in b.failures],
        first.more + tuple(t for b in batches[1:] for t in b.tokens),
    )
