""":mod:`tfrecordd.format.compiled`: each function gives the same answer with the extension and
with its pure-Python fallback."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.format import compiled

pytestmark = pytest.mark.skipif(not compiled.COMPILED, reason="tfrecordd._cframe is not built")


def _both(monkeypatch: pytest.MonkeyPatch, call: object) -> tuple[object, object]:
    assert callable(call)
    fast = call()
    with monkeypatch.context() as mp:
        mp.setattr(compiled, "COMPILED", False)
        slow = call()
    return fast, slow


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200).map(lambda b: b.replace(b"\x00", b"\n")),
    st.integers(0, 220),
    st.integers(0, 220),
    st.integers(0, 30),
)
def test_line_end_is_the_same_in_python(data: bytes, start: int, stop: int, lines: int) -> None:
    start, stop = min(start, len(data)), min(stop, len(data))
    stop = max(start, stop)
    with pytest.MonkeyPatch.context() as mp:
        fast, slow = _both(mp, lambda: compiled.line_end(data, start, stop, lines))
    assert fast == slow


@given(st.lists(st.integers(0, 1 << 40), max_size=40), st.integers(0, 1 << 50))
def test_record_starts_is_the_same_in_python(lengths: list[int], start: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        fast, slow = _both(mp, lambda: compiled.record_starts(array("Q", lengths), start))
    assert fast == slow


def test_without_the_extension_no_message_is_certified_and_nothing_is_framed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiled, "COMPILED", False)
    assert compiled.check_messages([b"", b"\x0a\x00", b"junk"], False) == [0, 1, 2]
    assert compiled.frame_many([b"x"]) is None
