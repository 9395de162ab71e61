"""A group's requests encoded together, each source's consecutive batches joined into one
write (:func:`encode_all`): what the daemon's encode thread and each worker process do with the
requests the encode stage sends them at once.

A partitioned dataset splits each batch into a part per folder: with 24 hours open, a batch of
4096 events gives 24 parts of about 20 KiB, too small to compress well alone (a deflate block
and its Huffman trees each), so each was sent framed only and compressed where the shard's
writer gathered it, in the daemon's own process. Where a group holds several batches of one
routed or partitioned source (as it does whenever the encode stage is busy), their parts are
joined per (dataset, folder) before they are compressed: where they make a unit large enough
to be worth one (:data:`~tfrecordd.pipeline.encoding.PACK_MIN_BYTES`), it is compressed where
it was encoded, in parallel, and the group's batches cross to the writer as one. A joined unit
goes into one shard whole: a shard's record cap then falls at the joined batches' edge, which
may leave it short of the cap by up to a group's records of its folder.

The batches joined so are one from then on: the first request's outcome carries every part,
and each later one is marked :attr:`~tfrecordd.pipeline.encoding.Outcome.joined`; the encode
stage makes of them one :class:`~tfrecordd.pipeline.encoding.EncodedBatch` holding every
batch's position in order, which the write stage writes in one step and a commit acknowledges
whole. Records keep their order in each part, and their batches' order.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from tfrecordd.format.compress import Compressor
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import Packed
from tfrecordd.pipeline.encoding import PACK_MIN_BYTES, EncodeRequest, Outcome, Part
from tfrecordd.pipeline.routing import Target, encode_with
from tfrecordd.plugin import Encoder

__all__ = ["encode_all", "joined_parts"]


def encode_all(
    built_of: Callable[[str], Encoder | Target], requests: list[EncodeRequest]
) -> list[Outcome]:
    """Each request's outcome, in order; consecutive requests of one target joined where each
    :attr:`~tfrecordd.pipeline.encoding.EncodeRequest.joins` the one before (see the module's
    docstring). ``built_of`` gives what was built of a request's
    :attr:`~tfrecordd.pipeline.encoding.EncodeRequest.encoder`."""
    out: list[Outcome] = []
    i = 0
    while i < len(requests):
        built = built_of(requests[i].encoder)
        j = i + 1
        if isinstance(built, Target):
            while (
                j < len(requests)
                and requests[j].joins
                and requests[j].encoder == requests[i].encoder
            ):
                j += 1
        if j - i == 1:
            out.append(encode_with(built, requests[i]))
        else:
            assert isinstance(built, Target)
            out.extend(_joined(built, requests[i:j]))
        i = j
    return out


def _joined(target: Target, requests: list[EncodeRequest]) -> list[Outcome]:
    outcomes = [target.encode(r, pack=False) for r in requests]
    parts = joined_parts(target, [o.parts or [] for o in outcomes])
    fallbacks: dict[tuple[str, str], int] = {}
    for o in outcomes:
        for key, n in o.fallbacks.items():
            fallbacks[key] = fallbacks.get(key, 0) + n
    first = outcomes[0]
    lead = Outcome(
        first.records, first.failures, first.line_failures, first.line_events, parts, fallbacks
    )
    return [lead] + [
        Outcome(o.records, o.failures, o.line_failures, o.line_events, [], joined=True)
        for o in outcomes[1:]
    ]


def joined_parts(target: Target, batches: list[list[Part]]) -> list[Part]:
    """The framed parts of several batches by (dataset, folder), in order of first appearance,
    their records in batch order: consecutive ones of one (dataset, folder) that frame to
    :data:`~tfrecordd.pipeline.encoding.PACK_MIN_BYTES` or more together (or alone, as a batch
    encoded alone would be), within the dataset's shard caps, are compressed into one unit; the
    others stay as they are, framed, for the shard's writer to gather (and to fill a shard to
    its record cap as closely as batch by batch)."""
    by_key: dict[tuple[str, str], list[Part]] = {}
    for parts in batches:
        for part in parts:
            by_key.setdefault((part.dataset, part.folder), []).append(part)
    out: list[Part] = []
    for (dataset, _), parts in by_key.items():
        plan = target.config.datasets[dataset]
        for run in _runs(parts, plan.max_records, plan.compression, plan.max_bytes // 4):
            if sum(p.records.unit.raw_size for p in run) >= PACK_MIN_BYTES:
                out.append(_unit(run, plan.compression, plan.level))
            else:
                out.extend(run)
    return out


def _runs(
    parts: list[Part], max_records: int, compression: Compression, max_bytes: int
) -> list[list[Part]]:
    """``parts`` cut into runs, in order, none past ``max_records`` records (``0``: no cap)
    or ``max_bytes`` once compressed at worst (``0``: no cap)."""
    runs: list[list[Part]] = []
    run: list[Part] = []
    records = raw = 0
    for part in parts:
        records += part.count
        raw += part.records.unit.raw_size
        if run and (
            (max_records and records > max_records)
            or (max_bytes and Compressor.bound(compression, raw) > max_bytes)
        ):
            runs.append(run)
            run, records, raw = [], part.count, part.records.unit.raw_size
        run.append(part)
    if run:
        runs.append(run)
    return runs


def _unit(run: list[Part], compression: Compression, level: int | None) -> Part:
    """Framed parts of one (dataset, folder) compressed into one unit."""
    lengths = array("Q")
    for p in run:
        lengths.extend(p.records.lengths)
    unit = Compressor.unit(compression, level, [p.records.unit.data for p in run])
    spans = [p.times for p in run if p.times is not None]
    times = (min(t[0] for t in spans), max(t[1] for t in spans)) if spans else None
    first = run[0]
    return Part(first.dataset, first.folder, Packed(unit, lengths), times)
