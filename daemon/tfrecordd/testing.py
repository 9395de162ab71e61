"""Conformance checks for source and encoder plugins, usable by third-party plugin packages too.

:func:`check_source` runs a source the way the daemon does, against a recording context, and
checks the contract every source keeps: the events that the outside world delivered arrive
(payloads intact, each exactly once, in order per producer), batches respect the context's
limits, tokens are JSON-serializable, ``fold`` is idempotent and associative (commits folded
one after the other give what folding them at once does), ``compact`` keeps what the tokens
cover (acking what it gives, as the daemon does, leaves nothing to read again) and is
idempotent, ``ack`` may be repeated and makes what it acks final (a source started afresh, with
no state, as after ``state_dir`` is lost, sends none of it again; ``final_ack=False`` for a
source whose positions live only in the journal), and the source stops promptly when cancelled.

:func:`check_encoder` checks what the daemon relies on from an encoder: its config survives
pickling (workers build encoders from it), each event of a batch gives one record or one failure
with a known :class:`~tfrecordd.plugin.FailureReason`, a record depends only on its event (not
on the batch around it), and ``encode_lines`` agrees with ``encode_batch``.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

import anyio

from tfrecordd.plugin import (
    EncoderConfig,
    EncodeResult,
    FailureReason,
    FileSystem,
    RawBatch,
    RawEvent,
    Source,
    SourceConfig,
    SourceContext,
)

Produce = Callable[[list[bytes]], Awaitable[None]]
"""Makes the outside world deliver these payloads, one event each, to a running source."""


@dataclass
class RecordingContext(SourceContext):
    """A :class:`SourceContext` that keeps every batch it is sent."""

    name: str = "contract"
    node_id: str = "contract-node"
    state_dir: str = "."
    max_batch_events: int = 7
    max_batch_bytes: int = 1 << 20
    fs: FileSystem = field(default_factory=FileSystem)
    batches: list[RawBatch] = field(default_factory=list)
    expected: int = 0
    arrived: anyio.Event = field(default_factory=anyio.Event)
    dropped: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The daemon makes a source's state folder before the source recovers.
        os.makedirs(self.state_dir, exist_ok=True)

    async def send(self, batch: RawBatch) -> None:
        self.batches.append(batch)
        if self.expected and len(self.payloads()) >= self.expected:
            self.arrived.set()
        await anyio.lowlevel.checkpoint()

    def count_dropped(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def count_refused(self, reason: str, n: int = 1) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + n

    def payloads(self) -> list[bytes]:
        """Every good event's payload, in arrival order."""
        return [e.payload for b in self.batches for e in b.expand() if e.error is None]


class ContractError(AssertionError):
    """A source broke the plugin contract."""


async def check_source(
    config: SourceConfig,
    produce: Produce,
    *,
    state_dir: str,
    events: int = 25,
    wait: float = 20.0,
    ordered: bool = True,
    settle: float = 1.0,
    final_ack: bool = True,
) -> RecordingContext:
    """Run ``config``'s source, deliver ``events`` events through ``produce``, and check the
    contract, waiting up to ``wait`` seconds for the events. Then ack the tokens, compacted
    the way the daemon compacts them, and run a new source from the folded state for
    ``settle`` seconds: it must send none of the events again; nor may one started with no state
    at all (``ack`` made the positions final: deleted, XACKed...), unless ``final_ack`` is
    false: a source whose positions live only in the daemon's journal (its folded state), with
    nothing in the outside world for ``ack`` to make final, passes ``final_ack=False``. Returns
    the context for further checks; raises :class:`ContractError`."""
    source = config.build()
    if not isinstance(source, Source):
        raise ContractError(f"{type(config).__name__}.build() returned {type(source)!r}")
    payloads = [
        f'{{"contract": {i}, "text": "\u00e9v\u00e9nement {i}"}}'.encode() for i in range(events)
    ]
    ctx = RecordingContext(name=config.name, state_dir=state_dir, expected=len(payloads))
    source.attach(ctx)
    await source.recover(None, [])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            await anyio.sleep(0.2)
            await produce(payloads)
            with anyio.move_on_after(wait):
                await ctx.arrived.wait()
            got = ctx.payloads()
            if sorted(got) != sorted(payloads):
                missing = [p for p in payloads if p not in got]
                raise ContractError(
                    f"expected {len(payloads)} events, got {len(got)}; missing {missing[:3]}"
                )
            if ordered and got != payloads:
                raise ContractError("events from one producer arrived out of order")
            tg.cancel_scope.cancel()
    finally:
        with anyio.fail_after(10, shield=True):
            await source.aclose()
    _check_batches(ctx, source)
    tokens = [b.token for b in ctx.batches]
    compacted = _check_compact(source, tokens)
    await source.ack(compacted)
    await source.ack(compacted)
    await _check_nothing_again(config, ctx, type(source).fold(None, compacted), settle)
    if final_ack:
        await _check_nothing_again(config, ctx, None, settle)
    return ctx


def _check_compact(source: Source, tokens: list[Any]) -> list[Any]:
    """What the daemon journals and acks for ``tokens``: each batch's token added to the
    compacted ones before it."""
    compact = type(source).compact
    step: list[Any] = []
    for token in tokens:
        step = compact([*step, token])
    try:
        step = json.loads(json.dumps(step))
    except (TypeError, ValueError) as e:
        raise ContractError(f"compact gave tokens that are not JSON-serializable: {e}") from e
    whole = compact(list(tokens))
    again = compact(list(step))
    if json.dumps(again, sort_keys=True) != json.dumps(step, sort_keys=True):
        raise ContractError("compact is not idempotent")
    fold = type(source).fold
    folded = json.dumps(fold(None, tokens), sort_keys=True)
    for got in (step, whole):
        if json.dumps(fold(None, got), sort_keys=True) != folded:
            raise ContractError("folding compacted tokens differs from folding the tokens")
    return step


async def _check_nothing_again(
    config: SourceConfig, ctx: RecordingContext, state: Any, settle: float
) -> None:
    """A new source that recovers from ``state`` (what was acked, folded; or ``None``: ack alone
    must have made the events final) sends none of them again."""
    source = config.build()
    again = RecordingContext(name=config.name, state_dir=ctx.state_dir)
    source.attach(again)
    await source.recover(state, [])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, again)
            await anyio.sleep(settle)
            tg.cancel_scope.cancel()
    finally:
        with anyio.fail_after(10, shield=True):
            await source.aclose()
    repeated = set(again.payloads()) & set(ctx.payloads())
    if repeated:
        how = (
            "by a source started with no state (ack did not make them final)"
            if state is None
            else "(acked as compacted)"
        )
        raise ContractError(
            f"{len(repeated)} acked events were sent again {how}: {sorted(repeated)[:3]}"
        )


def _check_batches(ctx: RecordingContext, source: Source) -> None:
    tokens: list[Any] = []
    for b in ctx.batches:
        if b.source != ctx.name:
            raise ContractError(f"batch names source {b.source!r}, not {ctx.name!r}")
        events = b.expand()
        if len(events) > ctx.max_batch_events:
            raise ContractError(f"batch of {len(events)} events > {ctx.max_batch_events}")
        try:
            tokens.append(json.loads(json.dumps(b.token)))
        except (TypeError, ValueError) as e:
            raise ContractError(f"token {b.token!r} is not JSON-serializable: {e}") from e
        for ev in events:
            if not isinstance(ev.payload, bytes) or not isinstance(ev.where, str):
                raise ContractError(f"event with payload {type(ev.payload)} / where {ev.where!r}")
    fold = type(source).fold
    once = fold(None, tokens)
    twice = fold(once, tokens)
    if json.dumps(once, sort_keys=True) != json.dumps(twice, sort_keys=True):
        raise ContractError("fold is not idempotent")
    # Commits are folded one after the other (and again after a crash): folding them in two
    # steps must give what folding them at once does, wherever the commits split.
    for cut in range(1, len(tokens)):
        stepwise = fold(fold(None, tokens[:cut]), tokens[cut:])
        if json.dumps(stepwise, sort_keys=True) != json.dumps(once, sort_keys=True):
            raise ContractError(f"fold is not associative: splitting the tokens at {cut} differs")


def _outcomes(result: EncodeResult, n: int, what: str) -> list[bytes | FailureReason]:
    """Per event, its record or its failure's reason; raises if the result does not line up."""
    failed: dict[int, FailureReason] = {}
    for failure in result.failures:
        at, reason, detail = failure
        if not isinstance(at, int) or not 0 <= at < n or at in failed:
            raise ContractError(f"{what}: failure index {at!r} out of range or repeated")
        if reason not in set(FailureReason):
            raise ContractError(f"{what}: unknown failure reason {reason!r} (not a FailureReason)")
        if not isinstance(detail, str):
            raise ContractError(f"{what}: failure detail {detail!r} is not text")
        failed[at] = FailureReason(reason)
    if len(result.records) + len(failed) != n:
        raise ContractError(
            f"{what}: {n} events gave {len(result.records)} records and {len(failed)} failures"
        )
    records = iter(result.records)
    out: list[bytes | FailureReason] = []
    for i in range(n):
        if i in failed:
            out.append(failed[i])
        else:
            record = next(records)
            if not isinstance(record, bytes):
                raise ContractError(f"{what}: record {i} is {type(record)!r}, not bytes")
            out.append(record)
    return out


def check_encoder(
    config: EncoderConfig, good: Sequence[RawEvent], bad: Sequence[RawEvent] = ()
) -> list[bytes]:
    """Check ``config``'s encoder on events it must encode (``good``) and events it must refuse
    (``bad``), mixed in one batch. Returns the records of ``good``; raises
    :class:`ContractError`."""
    try:
        copy = pickle.loads(pickle.dumps(config))
    except Exception as e:
        raise ContractError(f"{type(config).__name__} does not survive pickling: {e}") from e
    if copy != config:
        raise ContractError(f"{type(config).__name__} changes when pickled")
    events = [ev for pair in zip_longest(good, bad) for ev in pair if ev is not None]
    is_bad = [any(ev is b for b in bad) for ev in events]
    batch = _outcomes(copy.build().encode_batch(events), len(events), "encode_batch")
    for ev, outcome, refuse in zip(events, batch, is_bad, strict=True):
        if refuse and isinstance(outcome, bytes):
            raise ContractError(f"the bad event {ev.payload[:60]!r} was encoded")
        if not refuse and not isinstance(outcome, bytes):
            raise ContractError(f"the good event {ev.payload[:60]!r} failed: {outcome}")
    encoder = config.build()
    for ev, outcome in zip(events, batch, strict=True):
        (alone,) = _outcomes(encoder.encode_batch([ev]), 1, "encode_batch of one event")
        if alone != outcome:
            raise ContractError(
                f"the event {ev.payload[:60]!r} gives another outcome alone than in a batch"
            )
    if all(ev.format is None and ev.value is None and ev.error is None for ev in events):
        lines = _outcomes(encoder.encode_lines([ev.payload for ev in events]), len(events), "lines")
        if lines != batch:
            raise ContractError("encode_lines and encode_batch disagree on the same payloads")
    return [
        o for o, refuse in zip(batch, is_bad, strict=True) if not refuse and isinstance(o, bytes)
    ]
