"""JSON lines sent unsplit: how a source cuts a buffer into batches, and how the encode stage
splits a batch back into events (the same events the per-line reading always made)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.format import compiled as compiled_code
from tfrecordd.plugin import Lines, RawBatch
from tfrecordd_plugins.sources.spool_formats import cuts

LINE = st.sampled_from(
    [b"", b" ", b"\r", b"\t \x0b\x0c", b"{}", b" {}", b"[1]", b"x" * 9, b"\x01", b"a b", b"y" * 70]
)


def reference(data: bytes, offset: int, limit: int) -> list[tuple[str, bytes, bool]]:
    """One line at a time, as the source read them before lines were sent unsplit."""
    out = []
    at = offset
    records = data.split(b"\n")
    tail = records.pop()
    if tail:
        records.append(tail)
    for record in records:
        if len(record) > limit:
            out.append((f"f.jsonl:{at}", record[:limit], True))
        elif record and not record.isspace():
            out.append((f"f.jsonl:{at}", record, False))
        at += len(record) + 1
    return out


@settings(max_examples=500)
@given(
    st.lists(LINE, max_size=12),
    st.booleans(),
    st.integers(0, 10_000),
    st.sampled_from([1, 8, 64]),
)
def test_split_gives_the_events_line_by_line_reading_gives(
    lines: list[bytes], newline_at_end: bool, offset: int, limit: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    block = Lines(data, "f.jsonl", offset, limit)
    events = RawBatch("s", [], None, block).expand()
    got = [(ev.where, ev.payload, ev.error is not None) for ev in events]
    assert got == reference(data, offset, limit)
    payloads, refused = block.split()
    assert payloads == [ev.payload for ev in events if ev.error is None]
    assert len(block.offsets()) == len(payloads)
    assert all("max_line_bytes" in (ev.error or "") for ev in refused)


COMPILED = [False, True] if compiled_code.COMPILED else [False]


@pytest.mark.parametrize("compiled", COMPILED, ids=lambda c: "compiled" if c else "python")
@settings(max_examples=500)
@given(
    st.lists(st.sampled_from([0, 1, 5, 30, 200]), min_size=1, max_size=80),
    st.booleans(),
    st.integers(1, 12),
    st.sampled_from([1, 10, 100, 1 << 20]),
)
def test_cuts_make_batches_of_whole_lines_within_both_limits(
    compiled: bool, lengths: list[int], newline_at_end: bool, max_events: int, max_bytes: int
) -> None:
    with _compiled(compiled):
        _check_cuts(lengths, newline_at_end, max_events, max_bytes)


@contextmanager
def _compiled(on: bool) -> Iterator[None]:
    saved = compiled_code.COMPILED
    compiled_code.COMPILED = saved and on  # type: ignore[misc]
    try:
        yield
    finally:
        compiled_code.COMPILED = saved  # type: ignore[misc]


def _check_cuts(lengths: list[int], newline_at_end: bool, max_events: int, max_bytes: int) -> None:
    lines = b"\n".join(b"x" * n for n in lengths) + (b"\n" if newline_at_end else b"")
    # The lines sit inside a larger buffer (the source's read buffer): what lies before and
    # after them is never looked at.
    before, after = b"\n\nx\n", b"yy\n\n"
    inside = bytearray(before + lines + after)
    cut = _check_cuts_in(inside, len(before), len(lines), max_events, max_bytes)
    assert cut == _check_cuts_in(lines, 0, len(lines), max_events, max_bytes)


def _check_cuts_in(
    work: bytes | bytearray, at: int, size: int, max_events: int, max_bytes: int
) -> list[int]:
    buf = bytes(work[at : at + size])
    ends = [end - at for end in cuts(work, at, at + size, max_events, max_bytes)]
    start = 0
    for end in ends:
        assert start < end <= len(buf)
        assert end == len(buf) or buf[end - 1] == ord("\n")
        part = buf[start:end]
        lines = part.count(b"\n") + (not part.endswith(b"\n"))
        assert lines <= max_events
        if lines > 1:
            assert len(part) <= max_bytes
        if max_bytes == 1 << 20 and end < len(buf):
            # Exactly full: a shard's record cap is filled by whole batches.
            assert lines == max_events
        start = end
    assert start == len(buf)
    return ends


@pytest.mark.parametrize("compiled", COMPILED, ids=lambda c: "compiled" if c else "python")
def test_cuts_of_a_large_buffer_hold_max_events_each(compiled: bool) -> None:
    buf = b"".join(b'{"n": %d}\n' % i for i in range(100_000))
    with _compiled(compiled):
        ends = list(cuts(buf, 0, len(buf), 1000, 1 << 20))
    assert len(ends) == 100
    assert all(buf[:end].count(b"\n") == 1000 * (i + 1) for i, end in enumerate(ends))
