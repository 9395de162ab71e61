"""The redis-stream source's tokens without a server: compacting a commit's ID ranges covers
what they cover (plus only the gaps a read vouched for), and the ranges in flight stay few."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tfrecordd_plugins.sources.redis_stream import RedisStreamSource
from tfrecordd_plugins.sources.redis_stream.ranges import (
    InFlight,
    Key,
    key_of,
    read_token,
    span_of,
)

TOP = 2**64 - 1
SEQS = [0, 1, 2, 3, TOP]
PROBES = [(ms, seq) for ms in range(6) for seq in [*range(6), TOP - 1, TOP]]
"""Every ID the generated ranges can hold or touch, and some between and beyond."""

ids = st.tuples(st.integers(0, 4), st.sampled_from(SEQS)).map(lambda k: f"{k[0]}-{k[1]}")


@st.composite
def items(draw: st.DrawFn) -> Any:
    a, b = sorted([draw(ids), draw(ids)], key=key_of)
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return a
    if kind == 1:
        return [a, b]
    before = draw(ids.filter(lambda j: key_of(j) < key_of(a)))
    return [a, b, before]


tokens = st.lists(st.lists(items(), min_size=1, max_size=4), max_size=8)


def covered(toks: list[Any]) -> set[Key]:
    spans = [span_of(t) for token in toks for t in read_token(token)]
    return {p for p in PROBES if any(lo <= p <= hi for lo, hi, _ in spans)}


def vouched(toks: list[Any]) -> set[Key]:
    """IDs between a range and the entry it is joined to: nothing was pending there."""
    spans = [span_of(t) for token in toks for t in read_token(token)]
    return {p for p in PROBES for lo, _, j in spans if j is not None and j < p < lo}


def dump(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


@settings(max_examples=200, deadline=None)
@given(tokens, st.integers(0, 8))
# A range that takes over a ``joined`` from a twin must then merge with the range before it
# too, in the same pass (compact was not idempotent here).
@example(
    [
        ["0-0", "0-0", ["0-0", "0-2"], "0-18446744073709551615"],
        [["0-18446744073709551615", "0-18446744073709551615", "0-2"]],
    ],
    0,
)
def test_compact_covers_what_the_tokens_cover(toks: list[Any], cut: int) -> None:
    merged = RedisStreamSource.compact(toks)
    assert covered(toks) <= covered(merged) <= covered(toks) | vouched(toks)
    assert dump(RedisStreamSource.compact(merged)) == dump(merged), "idempotent"
    # The daemon compacts as batches come: that covers the same.
    step: list[Any] = []
    for token in toks:
        step = RedisStreamSource.compact([*step, token])
    head = RedisStreamSource.compact(toks[:cut])
    for partly in (step, RedisStreamSource.compact([*head, *toks[cut:]])):
        assert covered(toks) <= covered(partly) <= covered(toks) | vouched(toks)
    fold = RedisStreamSource.fold
    assert fold(None, merged) == fold(None, toks)
    assert json.loads(json.dumps(merged)) == merged


def test_batches_read_back_to_back_become_one_range() -> None:
    def tok(*items: Any) -> dict[str, Any]:
        return {"v": 1, "r": list(items)}

    # 1-0..1-3, then 1-4..2-0 (joined to 1-3), then 5-0.. (joined to 2-0), then 9-0 (not).
    batches = [tok(["1-0", "1-3"]), tok(["1-4", "2-0"]), tok(["5-0", "7-2", "2-0"]), tok("9-0")]
    assert RedisStreamSource.compact(batches) == [tok(["1-0", "7-2"]), tok("9-0")]
    # Not joined to what ends the range before: an entry pending elsewhere may lie between.
    assert RedisStreamSource.compact([tok(["1-0", "1-3"]), tok(["3-0", "4-0", "2-0"])]) == [
        tok(["1-0", "1-3"]),
        tok(["3-0", "4-0", "2-0"]),
    ]
    # What an older release journalled (lists of IDs alone, and plain ranges): compacted into
    # tokens of this version, covering the same.
    assert RedisStreamSource.compact([["1-0", "1-1"], [["1-2", "1-5"]], ["3-0"]]) == [
        tok(["1-0", "1-5"]),
        tok("3-0"),
    ]


def test_ranges_in_flight_merge_and_are_cut_by_acks() -> None:
    flight = InFlight()
    for n in range(1000):
        # Batches read back to back, each joined to the one before, across milliseconds.
        flight.add((n, 0), (n, 9), (n - 1, 9) if n else None)
    assert len(flight) == 1
    flight.add((2000, 0), (2000, 0))
    assert len(flight) == 2
    # Acked shard by shard, in ranges that cut the one in flight.
    flight.discard((0, 0), (499, 9))
    assert (499, 9) not in flight
    assert (500, 0) in flight
    assert (999, 9) in flight
    assert len(flight) == 2
    # The next shard's first range is joined to the last one's: what lies between goes too.
    flight.discard((500, 0), (999, 9), (499, 9))
    assert [k for k in itertools.product(range(1001), range(10)) if k in flight] == []
    assert (2000, 0) in flight
    assert len(flight) == 1
    flight.discard((2000, 0), (2000, 0))
    assert len(flight) == 0
    assert flight.lowest() is None
