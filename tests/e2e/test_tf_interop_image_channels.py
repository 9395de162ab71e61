"""``image/channels`` is what ``tf.io.decode_image`` decodes, for every kind of file the image
encoder reads that TensorFlow decodes: a reshape by the stored size and channels holds."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from PIL import Image

from tests.unit.test_image_encoder import event, exif, png, saved
from tfrecordd.format import proto
from tfrecordd_plugins.encoders.image import CHANNELS, HEIGHT, WIDTH, ImageEncoderConfig

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def coloured_palette(fmt: str) -> bytes:
    image = Image.new("P", (7, 5))
    image.putpalette([(i * 7) % 256 for i in range(768)])
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


FILES = [
    ("jpeg gray", saved("L", "JPEG")),
    ("jpeg rgb", saved("RGB", "JPEG")),
    ("jpeg cmyk", saved("CMYK", "JPEG")),
    ("jpeg cmyk progressive", saved("CMYK", "JPEG", progressive=True)),
    ("jpeg cmyk with EXIF", saved("CMYK", "JPEG", exif=exif(6))),
    *(
        (f"png depth {d} colour {c}", png(d, c))
        for c, ds in {
            0: (1, 2, 4, 8, 16),
            2: (8, 16),
            3: (1, 2, 4, 8),
            4: (8, 16),
            6: (8, 16),
        }.items()
        for d in ds
    ),
    ("png palette, transparent", saved("P", "PNG", transparency=3)),
    ("png gray, transparent", saved("L", "PNG", transparency=3)),
    ("png rgb, transparent", saved("RGB", "PNG", transparency=(1, 2, 3))),
    ("png 16-bit (Pillow)", saved("I;16", "PNG")),
    ("gif", saved("P", "GIF")),
    ("gif from rgb", saved("RGB", "GIF")),
    ("bmp 8-bit gray", saved("L", "BMP")),
    ("bmp 8-bit palette", coloured_palette("BMP")),
    ("png 8-bit palette (Pillow)", coloured_palette("PNG")),
    ("bmp 24-bit", saved("RGB", "BMP")),
    ("bmp 32-bit", saved("RGBA", "BMP")),
    ("webp rgb", saved("RGB", "WEBP")),
    ("webp rgba", saved("RGBA", "WEBP")),
]


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "pillow"])
@pytest.mark.parametrize(("name", "data"), FILES, ids=[f[0] for f in FILES])
def test_channels_are_what_tensorflow_decodes(tf: Any, fast: bool, name: str, data: bytes) -> None:
    encoder = ImageEncoderConfig().build()
    if not fast:
        encoder.fast_jpeg = encoder.fast_png = False
    result = encoder.encode_batch([event(data, "x")])
    assert result.failures == []
    features = proto.parse_example(result.records[0])
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert features[CHANNELS] == [decoded.shape[-1]]
    shape = [features[HEIGHT][0], features[WIDTH][0], features[CHANNELS][0]]
    assert tf.reshape(decoded, shape).shape == shape
