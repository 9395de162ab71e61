"""Stream compression: detection, sync units, size bounds, and strict streaming decompression."""

from __future__ import annotations

import gzip
import io
import os
import random
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.errors import (
    CompressionError,
    CorruptStreamError,
    DecompressionLimitError,
    TruncatedStreamError,
)
from tfrecordd.format.compress import PROBE_MIN_BYTES, Compressor, incompressible
from tfrecordd.format.compression import DEFAULT_LEVELS, SUFFIXES, TF_COMPRESSION_TYPE, Compression
from tfrecordd.format.decompress import detect, open_decompressed
from tfrecordd.format.framing import frame, masked_crc32c

COMPRESSED = [Compression.GZIP, Compression.ZLIB, Compression.ZSTD]


def _compress(compression: Compression, units: list[bytes], level: int | None = None) -> bytes:
    c = Compressor(compression, level)
    out = bytearray()
    for unit in units:
        out += c.compress(unit)
        out += c.sync()
    out += c.finish()
    return bytes(out)


def _decompress(data: bytes, compression: Compression, max_bytes: int | None = None) -> bytes:
    reader = open_decompressed(io.BytesIO(data), compression, path="mem", max_bytes=max_bytes)
    out = bytearray()
    while chunk := reader.read(7919):
        out += chunk
    return bytes(out)


def test_names() -> None:
    assert [c.value for c in Compression] == ["none", "gzip", "zlib", "zstd"]
    assert SUFFIXES[Compression.GZIP] == ".tfrecord.gz"
    assert SUFFIXES[Compression.ZLIB] == ".tfrecord.zz"
    assert SUFFIXES[Compression.ZSTD] == ".tfrecord.zst"
    assert SUFFIXES[Compression.NONE] == ".tfrecord"
    assert TF_COMPRESSION_TYPE == {
        Compression.NONE: "",
        Compression.GZIP: "GZIP",
        Compression.ZLIB: "ZLIB",
        Compression.ZSTD: None,
    }


@pytest.mark.parametrize("compression", list(Compression))
def test_detect_from_content(compression: Compression) -> None:
    head = _compress(compression, [frame(b"payload") * 3])[:12]
    assert detect(head) is compression
    assert detect(head, "shard" + SUFFIXES[compression]) is compression
    if compression is not Compression.ZLIB:
        other = Compression.ZSTD if compression is not Compression.ZSTD else Compression.GZIP
        assert detect(head, "mislabeled" + SUFFIXES[other]) is compression


def test_detect_plain_header_wins_over_a_magic_lookalike() -> None:
    record = b"x" * 0x8B1F  # its little-endian length starts with the gzip magic 1f 8b
    head = frame(record)[:12]
    assert head.startswith(b"\x1f\x8b")
    assert detect(head, "shard.tfrecord.gz") is Compression.NONE


def test_detect_weak_zlib_header_yields_to_the_suffix() -> None:
    head = b"\x78\x01" + bytes(10)  # passes the zlib header check, and is not a TFRecord header
    assert detect(head) is Compression.ZLIB
    assert detect(head, "a.tfrecord.gz") is Compression.GZIP
    assert detect(head, "a.zlib") is Compression.ZLIB


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.tfrecord.gz", Compression.GZIP),
        ("a.GZ", Compression.GZIP),
        ("a.tfrecord.zz", Compression.ZLIB),
        ("a.zlib", Compression.ZLIB),
        ("a.tfrecord.zst", Compression.ZSTD),
        ("a.zstd", Compression.ZSTD),
        ("a.tfrecord", Compression.NONE),
        ("", Compression.NONE),
    ],
)
def test_detect_falls_back_to_the_suffix(name: str, expected: Compression) -> None:
    assert detect(b"", name) is expected
    assert detect(b"\x89PNG\r\n\x1a\n\0\0\0\0", name) is expected


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(list(Compression)),
    st.lists(st.lists(st.binary(max_size=2000), max_size=5), max_size=6),
)
def test_round_trip_with_sync_points(compression: Compression, units: list[list[bytes]]) -> None:
    c = Compressor(compression)
    out = bytearray()
    raw = bytearray()
    for unit in units:
        for piece in unit:
            out += c.compress(piece)
            raw += piece
        out += c.sync()
        if compression is not Compression.ZLIB:
            # After a sync, everything written so far is a complete stream on its own.
            assert _decompress(bytes(out), compression) == raw
    out += c.finish()
    assert _decompress(bytes(out), compression) == raw


def test_sync_units_are_what_standard_tools_expect() -> None:
    units = [b"one " * 100, b"two " * 100, b"three"]
    joined = b"".join(units)
    gz = _compress(Compression.GZIP, units)
    assert gzip.decompress(gz) == joined
    assert gz.count(b"\x1f\x8b\x08") == 3  # one member per unit
    zl = _compress(Compression.ZLIB, units)
    assert zlib.decompress(zl) == joined  # one zlib stream with full flushes inside
    zs = _compress(Compression.ZSTD, units)
    frames = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    assert frames.decompress(zs) == joined
    assert zs.count(b"\x28\xb5\x2f\xfd") == 3
    params = zstandard.get_frame_parameters(zs)
    assert params.has_checksum


@pytest.mark.parametrize("compression", list(Compression))
def test_empty_stream_is_valid_and_empty(compression: Compression) -> None:
    data = _compress(compression, [])
    assert _decompress(data, compression) == b""
    if compression is Compression.GZIP:
        assert gzip.decompress(data) == b""
    if compression is not Compression.NONE:
        assert data  # a real (empty) stream, not zero bytes


def test_sync_without_data_adds_nothing() -> None:
    for compression in Compression:
        c = Compressor(compression)
        c.compress(b"data")
        assert c.sync() or compression is Compression.NONE
        assert c.sync() == b""


@pytest.mark.parametrize("compression", COMPRESSED)
def test_bound_holds_for_incompressible_data(compression: Compression) -> None:
    rng = random.Random(7)
    levels = [-5, 1, 3, 19] if compression is Compression.ZSTD else [0, 1, 6, 9]
    sizes = [0, 1, 100, 16383, 16384, 65536, 131072, 131075, 400_000, 1 << 20]
    for level in levels:
        for n in sizes:
            data = os.urandom(n)
            c = Compressor(compression, level)
            out = bytearray()
            i = 0
            while i < n:
                step = rng.randint(1, 70_000)
                out += c.compress(data[i : i + step])
                i += step
            out += c.sync() + c.finish()
            assert len(out) <= Compressor.bound(compression, n), (level, n, len(out))


@pytest.mark.parametrize("compression", COMPRESSED)
def test_written_plus_bound_caps_the_size_after_sync_and_finish(compression: Compression) -> None:
    # What the shard writer relies on: with `written` bytes out and a unit of n raw bytes pending,
    # syncing and finishing never makes the file larger than written + bound(n).
    rng = random.Random(11)
    units = [os.urandom(rng.randint(0, 40_000)) for _ in range(8)]
    for k in range(len(units)):
        c = Compressor(compression)
        written = 0
        for unit in units[:k]:
            written += len(c.compress(unit)) + len(c.sync())
        last = units[k]
        total = written + len(c.compress(last)) + len(c.sync()) + len(c.finish())
        assert total <= written + Compressor.bound(compression, len(last))


@pytest.mark.parametrize("compression", list(Compression))
@given(
    plan=st.lists(
        st.tuples(
            st.booleans(),
            st.lists(
                # Small pieces are joined before they are compressed, large ones (past 16 KiB
                # on average) are not.
                st.one_of(
                    st.binary(max_size=3000),
                    st.tuples(st.binary(min_size=1, max_size=64), st.integers(300, 700)).map(
                        lambda t: t[0] * t[1]
                    ),
                ),
                max_size=4,
            ),
        ),
        max_size=6,
    ),
    level=st.sampled_from([None, 0, 1, 9]),
)
@settings(max_examples=40, deadline=None)
def test_units_made_apart_join_any_stream(
    compression: Compression, plan: list[tuple[bool, list[bytes]]], level: int | None
) -> None:
    # Units compressed elsewhere (by encode workers), appended between ordinary writes: the stream
    # holds exactly the bytes in order, whatever the mix.
    if compression is Compression.ZSTD and level is not None:
        level = {0: 1, 9: 19}.get(level, level)
    c = Compressor(compression, level)
    out = bytearray()
    raw = bytearray()
    for made_apart, pieces in plan:
        if made_apart:
            unit = Compressor.unit(compression, level, pieces)
            assert unit.raw_size == sum(map(len, pieces))
            out += c.append_unit(unit)
        else:
            for piece in pieces:
                out += c.compress(piece)
        raw += b"".join(pieces)
    out += c.finish()
    assert _decompress(bytes(out), compression) == raw
    if compression is Compression.ZLIB:
        assert zlib.decompress(bytes(out)) == raw  # one stream, with a correct Adler-32
    if compression is Compression.GZIP:
        assert gzip.decompress(bytes(out)) == raw


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("sizes", [[20_000, 30_000, 17_000], [40_000, 10], [10, 5, 70_000]])
def test_a_unit_of_large_pieces_holds_each_in_order(
    compression: Compression, sizes: list[int]
) -> None:
    # Pieces of 16 KiB or more on average are compressed one by one, not joined first.
    pieces = [bytes([65 + k]) * n + os.urandom(64) for k, n in enumerate(sizes)]
    c = Compressor(compression)
    out = c.append_unit(Compressor.unit(compression, None, pieces)) + c.finish()
    assert _decompress(out, compression) == b"".join(pieces)


@pytest.mark.parametrize("compression", COMPRESSED)
def test_a_unit_is_no_larger_than_its_bound(compression: Compression) -> None:
    for n in (0, 1, 5000, 200_000):
        unit = Compressor.unit(compression, None, [os.urandom(n)])
        assert len(unit.data) <= Compressor.bound(compression, n)


def test_a_unit_of_another_compression_is_refused() -> None:
    unit = Compressor.unit(Compression.GZIP, None, [b"x"])
    with pytest.raises(ValueError, match="gzip unit in a zstd stream"):
        Compressor(Compression.ZSTD).append_unit(unit)


def test_bound_of_none_is_exact() -> None:
    assert Compressor.bound(Compression.NONE, 12345) == 12345


@pytest.mark.parametrize("compression", COMPRESSED)
def test_every_cut_is_truncation_except_at_a_unit_end(compression: Compression) -> None:
    units = [frame(os.urandom(300) + b"z" * 300), frame(b"second" * 50)]
    c = Compressor(compression)
    # gzip members and zstd frames are complete streams, so a cut right after one is a clean end;
    # zlib units share one stream, which only finish() completes.
    unit_end = len(c.compress(units[0]) + c.sync()) if compression is not Compression.ZLIB else -1
    data = _compress(compression, units)
    for cut in range(1, len(data)):
        if cut == unit_end:
            assert _decompress(data[:cut], compression) == units[0]
            continue
        with pytest.raises(TruncatedStreamError) as info:
            _decompress(data[:cut], compression)
        assert info.value.path == "mem"
        assert 0 <= info.value.offset <= cut


@pytest.mark.parametrize("compression", COMPRESSED)
def test_a_bit_flip_is_an_error_or_changes_nothing(compression: Compression) -> None:
    # Some bits are covered by no check and mean nothing (gzip mtime/OS bytes, padding after the
    # last deflate block, zstd window size): a flip there decodes to the same bytes. Any other flip
    # must be an error, never different data.
    raw = frame(os.urandom(200) + b"q" * 500) + frame(b"more" * 64)
    data = _compress(compression, [raw[:716], raw[716:]])
    detected = 0
    rng = random.Random(3)
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 1 << rng.randrange(8)
        try:
            assert _decompress(bytes(flipped), compression) == raw
        except CompressionError:
            detected += 1
    assert detected > len(data) * 3 // 4


@pytest.mark.parametrize("compression", COMPRESSED)
def test_trailing_garbage_is_corruption(compression: Compression) -> None:
    data = _compress(compression, [frame(b"record")])
    for garbage in (b"\0", b"\0" * 16, b"garbage after the stream"):
        with pytest.raises(CorruptStreamError):
            _decompress(data + garbage, compression)


@pytest.mark.parametrize("compression", COMPRESSED)
def test_garbage_alone_is_an_error(compression: Compression) -> None:
    rng = random.Random(5)
    for n in (1, 2, 3, 4, 12, 1000):
        with pytest.raises(CompressionError):
            _decompress(rng.randbytes(n), compression)


@pytest.mark.parametrize("compression", COMPRESSED)
def test_decompression_bomb_is_stopped(compression: Compression) -> None:
    bomb = _compress(compression, [bytes(64 << 20)])
    assert len(bomb) < 1 << 20
    with pytest.raises(DecompressionLimitError, match="more than 1048576 bytes"):
        _decompress(bomb, compression, max_bytes=1 << 20)
    assert len(_decompress(bomb, compression, max_bytes=64 << 20)) == 64 << 20


def test_zstd_skippable_frames_are_skipped() -> None:
    skippable = struct.pack("<II", 0x184D2A53, 5) + b"notes"
    data = skippable + _compress(Compression.ZSTD, [b"abc"]) + skippable
    assert _decompress(data, Compression.ZSTD) == b"abc"
    with pytest.raises(TruncatedStreamError):
        _decompress(data[:-2], Compression.ZSTD)


def test_zstd_checksum_mismatch_is_corruption() -> None:
    data = bytearray(_compress(Compression.ZSTD, [b"checked content"]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptStreamError, match="checksum"):
        _decompress(bytes(data), Compression.ZSTD)


def test_none_is_passthrough() -> None:
    data = frame(b"plain") + b"anything"
    assert _decompress(data, Compression.NONE) == data


def test_detect_plain_header_check_uses_the_length_crc() -> None:
    header = struct.pack("<Q", 5)
    assert detect(header + struct.pack("<I", masked_crc32c(header))) is Compression.NONE
    assert detect(header + struct.pack("<I", masked_crc32c(header) ^ 1), "x.zst") is (
        Compression.ZSTD
    )


def _json_like(n: int) -> bytes:
    rng = random.Random(n)
    out = bytearray()
    while len(out) < n:
        out += b'{"user": %d, "movie": ["title %d"], "rating": %d}\n' % (
            rng.randrange(10**6),
            rng.randrange(500),
            rng.randrange(5),
        )
    return bytes(out[:n])


def test_the_sample_tells_noise_from_text() -> None:
    assert incompressible(os.urandom(100_000), 3)
    assert incompressible(b"\x00" * 10_000 + os.urandom(90_000), 3)  # the middle is sampled
    assert not incompressible(_json_like(100_000), 3)
    assert not incompressible(_json_like(100_000), 19)


def test_the_sample_finds_what_only_entropy_coding_saves() -> None:
    # No repeats for a match finder, yet fewer than 8 bits a byte: zstd's negative levels leave
    # such bytes as they are; the sample must still see that the unit's level would shrink them.
    rng = random.Random(7)
    hex_digits = bytes(rng.choice(b"0123456789abcdef") for _ in range(100_000))
    floats = struct.pack("<25000f", *(rng.gauss(0, 1) for _ in range(25_000)))
    for data in (hex_digits, floats):
        assert not incompressible(data, 3)
        assert not incompressible(data, 19)
        unit = Compressor.unit(Compression.ZSTD, None, [data])
        assert len(unit.data) < len(data) * 0.97


def _zstd_frame_parts(data: bytes) -> tuple[int, bool, int | None, list[tuple[int, int]]]:
    """(frame header descriptor, content checksum flag, content size, [(block type, size)]) of
    the one zstd frame ``data`` holds, read by the format's rules (RFC 8878, 3.1.1)."""
    assert data[:4] == b"\x28\xb5\x2f\xfd"
    fhd = data[4]
    single = fhd >> 5 & 1
    fcs_bytes = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = int.from_bytes(data[pos : pos + fcs_bytes], "little") if fcs_bytes else None
    if fcs_bytes == 2:
        size = (size or 0) + 256
    pos += fcs_bytes
    blocks = []
    while True:
        header = int.from_bytes(data[pos : pos + 3], "little")
        kind, n = header >> 1 & 3, header >> 3
        blocks.append((kind, n))
        pos += 3 + (1 if kind == 1 else n)
        if header & 1:
            break
    checksum = bool(fhd & 4)
    assert pos + (4 if checksum else 0) == len(data)
    return fhd, checksum, size, blocks


def test_a_zstd_unit_that_does_not_compress_is_stored_in_raw_blocks() -> None:
    noise = os.urandom(100_000)
    pieces = [b"head", noise, b"tail"]
    data = b"".join(pieces)
    unit = Compressor.unit(Compression.ZSTD, None, pieces)
    _, checksum, size, blocks = _zstd_frame_parts(unit.data)
    assert (checksum, size, blocks) == (False, len(data), [(0, len(data))])
    assert unit.data.endswith(data)
    assert unit.raw_size == len(data)
    assert len(unit.data) <= Compressor.bound(Compression.ZSTD, len(data))
    assert _decompress(unit.data, Compression.ZSTD) == data
    assert zstandard.ZstdDecompressor().decompress(unit.data) == data


def test_a_stored_unit_is_cut_into_blocks_of_at_most_128_kib_across_its_pieces() -> None:
    block = 128 << 10
    pieces = [os.urandom(block - 5), os.urandom(11), b"", os.urandom(2 * block + 3), b"x"]
    data = b"".join(pieces)
    unit = Compressor.unit(Compression.ZSTD, 19, pieces)
    _, checksum, size, blocks = _zstd_frame_parts(unit.data)
    assert (checksum, size) == (False, len(data))
    assert blocks == [(0, block), (0, block), (0, block), (0, len(data) - 3 * block)]
    assert len(unit.data) <= Compressor.bound(Compression.ZSTD, len(data))
    assert zstandard.ZstdDecompressor().decompressobj().decompress(unit.data) == data
    # In a stream, between checksummed frames, as a shard holds them.
    c = Compressor(Compression.ZSTD)
    stream = c.compress(b"before") + c.append_unit(unit) + c.compress(b"after") + c.finish()
    assert _decompress(stream, Compression.ZSTD) == b"before" + data + b"after"


@pytest.mark.parametrize("level", [None, 1, 19])
def test_a_zstd_unit_that_compresses_keeps_its_level(level: int | None) -> None:
    text = _json_like(100_000)
    unit = Compressor.unit(Compression.ZSTD, level, [text])
    chosen = DEFAULT_LEVELS[Compression.ZSTD] if level is None else level
    assert unit.data == zstandard.ZstdCompressor(level=chosen, write_checksum=True).compress(text)
    assert len(unit.data) < len(text) // 3


def test_small_zstd_units_are_not_sampled() -> None:
    noise = os.urandom(PROBE_MIN_BYTES - 1)
    unit = Compressor.unit(Compression.ZSTD, None, [noise])
    assert unit.data == zstandard.ZstdCompressor(level=3, write_checksum=True).compress(noise)


def test_units_made_in_threads_at_once_are_each_whole() -> None:
    pieces = [os.urandom(80_000) if i % 2 else _json_like(80_000) for i in range(16)]
    with ThreadPoolExecutor(4) as pool:
        units = list(pool.map(lambda p: Compressor.unit(Compression.ZSTD, None, [p]), pieces * 4))
    assert [_decompress(u.data, Compression.ZSTD) for u in units] == pieces * 4
