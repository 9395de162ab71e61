"""Case 3: ~100 KiB JPEG and PNG files to zstd Example shards.

Baseline: the bare zstandard compressor (same level, same frame checksum) on the same image
bytes, with nothing else to do. Ours: the image encoder (header read by Pillow, Example written),
each file's batch packed into a unit as the daemon's encode stage packs it (a unit that does not
compress is stored, as raw zstd blocks, whose frame has no content checksum: the records' own
CRC32Cs cover them), and ``RecordWriter(zstd)`` appending the units.
"""

from __future__ import annotations

from pathlib import Path

import zstandard

from tfrecordd.format.compression import DEFAULT_LEVELS, Compression
from tfrecordd.format.writer import RecordWriter, pack
from tfrecordd.plugin import RawEvent
from tfrecordd_plugins.encoders.image import ImageEncoderConfig

from ..data import images
from ..harness import Context, Row, best_of_pair, ratio_row

TARGET = 0.8


def run(ctx: Context) -> list[Row]:
    files = images(ctx.images, ctx.seed)
    total = sum(len(b) for _, b in files)
    events = [
        RawEvent(data, f"cats/{name}", value={"filename": name, "label": "cats"}, format="file")
        for name, data in files
    ]
    encoder = ImageEncoderConfig.model_validate({"labels": {"cats": 0}}).build()
    level = DEFAULT_LEVELS[Compression.ZSTD]

    def ours(path: Path) -> None:
        with path.open("wb") as f:
            writer = RecordWriter(f.write, Compression.ZSTD)
            for ev in events:
                result = encoder.encode_batch([ev])
                if result.failures:
                    raise AssertionError(result.failures)
                # As the daemon's encode stage does with any batch of PACK_MIN_BYTES or more.
                writer.write_packed(pack(result.records, Compression.ZSTD, level))
            writer.finish()

    def forced(path: Path) -> None:
        # Every byte through zstd at the shard's level, as the baseline does: what the encoder
        # and the framing cost on top of the compressor.
        with path.open("wb") as f:
            writer = RecordWriter(f.write, Compression.ZSTD)
            for ev in events:
                writer.write_many(encoder.encode_batch([ev]).records)
            writer.finish()

    def bare(path: Path) -> None:
        with path.open("wb") as f:
            cobj = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj()
            for _, data in files:
                f.write(cobj.compress(data))
            f.write(cobj.flush())

    # A run takes tens of milliseconds, and this kind of machine has slow spells of a second or
    # so: enough interleaved runs that each side gets some outside them.
    repeat = ctx.repeat if ctx.quick else max(ctx.repeat, 25)
    with ctx.tmpdir("images") as tmp:
        t_ours, t_bare = best_of_pair(
            lambda: ours(tmp / "ours.tfrecord.zst"), lambda: bare(tmp / "bare.zst"), repeat
        )
        t_forced, t_bare2 = best_of_pair(
            lambda: forced(tmp / "forced.tfrecord.zst"),
            lambda: bare(tmp / "bare.zst"),
            repeat,
        )
        ratio = (tmp / "ours.tfrecord.zst").stat().st_size / total
        forced_ratio = (tmp / "forced.tfrecord.zst").stat().st_size / total
    assert t_bare is not None
    assert t_bare2 is not None
    mib = total / 2**20
    return [
        ratio_row(
            "3 images -> zstd",
            "MiB/s of image bytes",
            "MiB/s",
            mib / t_ours,
            mib / t_bare,
            f"zstandard level {level} on the same bytes",
            TARGET,
            f"{len(files)} files, {total / len(files) / 1024:.0f} KiB average; "
            f"shard is {ratio:.3f} of the images' size (units that do not compress are "
            "stored as raw zstd blocks)",
        ),
        ratio_row(
            "3 images -> zstd",
            f"MiB/s of image bytes, every byte at level {level}",
            "MiB/s",
            mib / t_forced,
            mib / t_bare2,
            f"zstandard level {level} on the same bytes",
            None,
            f"what encoding and framing cost beside the compressor; shard is "
            f"{forced_ratio:.3f} of the images' size",
        ),
    ]
