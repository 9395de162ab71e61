"""TFRecord framing: layout, CRCs, and truncated vs corrupted streams."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfrecordd.errors import CorruptRecordError, RecordLimitError, TruncatedRecordError
from tfrecordd.format.framing import (
    FOOTER_SIZE,
    HEADER_SIZE,
    OVERHEAD,
    frame,
    frame_many,
    header_is_valid,
    iter_framed,
    masked_crc32c,
)

records_st = st.lists(st.binary(max_size=300), max_size=20)


class _Trickle(io.RawIOBase):
    """A stream that returns at most one byte per read, as slow pipes and sockets may."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1, /) -> bytes:
        chunk = self._data[self._pos : self._pos + min(max(n, 0), 1)]
        self._pos += len(chunk)
        return chunk


def _read_all(data: bytes, **kwargs: Any) -> list[tuple[int, bytes]]:
    return list(iter_framed(io.BytesIO(data), "mem", **kwargs))


def test_masked_crc32c_of_the_standard_check_string() -> None:
    # CRC32C("123456789") is 0xE3069283; rotated right by 15 and offset by 0xa282ead8.
    assert masked_crc32c(b"123456789") == 0xC78AB0E5
    assert masked_crc32c(b"") == 0xA282EAD8


def test_frame_layout() -> None:
    framed = frame(b"abc")
    length, length_crc = struct.unpack_from("<QI", framed)
    (data_crc,) = struct.unpack_from("<I", framed, HEADER_SIZE + 3)
    assert len(framed) == 3 + OVERHEAD == 3 + HEADER_SIZE + FOOTER_SIZE
    assert length == 3
    assert length_crc == masked_crc32c(struct.pack("<Q", 3))
    assert framed[HEADER_SIZE : HEADER_SIZE + 3] == b"abc"
    assert data_crc == masked_crc32c(b"abc")
    assert header_is_valid(framed)
    assert not header_is_valid(framed[:11])


@given(records_st)
def test_frame_many_is_frames_concatenated(records: list[bytes]) -> None:
    assert frame_many(records) == b"".join(frame(r) for r in records)


@given(records_st)
def test_round_trip_with_offsets(records: list[bytes]) -> None:
    got = _read_all(frame_many(records))
    assert [r for _, r in got] == records
    offsets = [0]
    for r in records[:-1]:
        offsets.append(offsets[-1] + len(r) + OVERHEAD)
    assert [o for o, _ in got] == offsets[: len(records)]


def test_short_reads_are_not_truncation() -> None:
    records = [b"x" * 40, b"", b"yz"]
    got = list(iter_framed(_Trickle(frame_many(records)), "trickle"))
    assert [r for _, r in got] == records


def test_every_cut_inside_a_record_is_truncated() -> None:
    first, second = frame(b"first record"), frame(b"2nd")
    data = first + second
    for cut in range(len(data) + 1):
        if cut in (0, len(first), len(data)):
            whole = {0: 0, len(first): 1, len(data): 2}[cut]
            assert len(_read_all(data[:cut])) == whole
            continue
        with pytest.raises(TruncatedRecordError) as info:
            _read_all(data[:cut])
        assert info.value.offset == (0 if cut < len(first) else len(first))
        assert info.value.path == "mem"


def test_every_bit_flip_is_corruption() -> None:
    data = frame(b"A") + frame(b"record two")
    for i in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            with pytest.raises(CorruptRecordError) as info:
                _read_all(bytes(flipped))
            assert info.value.offset == (0 if i < len(frame(b"A")) else len(frame(b"A")))


def test_length_above_limit_is_oversized_and_not_read() -> None:
    # A valid header claiming 1 TiB, and no body: the limit check comes before any read of it.
    # Its CRC matches, so it is reported as over the limit, not as corruption.
    header = struct.pack("<Q", 1 << 40)
    data = frame(b"ok") + header + struct.pack("<I", masked_crc32c(header))
    with pytest.raises(RecordLimitError, match="over the limit of 1024 bytes") as info:
        _read_all(data, max_record_bytes=1024)
    assert info.value.offset == len(frame(b"ok"))
    assert not isinstance(info.value, CorruptRecordError)


def test_length_within_limit_but_missing_body_is_truncated() -> None:
    header = struct.pack("<Q", 1 << 20)
    data = header + struct.pack("<I", masked_crc32c(header)) + b"partial"
    with pytest.raises(TruncatedRecordError):
        _read_all(data)


def test_garbage_is_reported_as_corrupted_at_offset_zero() -> None:
    with pytest.raises(CorruptRecordError, match="not a TFRecord") as info:
        _read_all(b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert info.value.offset == 0


@pytest.mark.tensorflow
def test_frame_matches_tensorflow_writer_byte_for_byte(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    records = [b"", b"a", b"\x00\xff" * 1000, bytes(range(256))]
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    assert path.read_bytes() == frame_many(records)
