"""tfrecordd's protobuf classes and TensorFlow's live in one process, imported in either order."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = """
from tfrecordd.format.wire import ExampleWriter, FeatureType
features = [("id", FeatureType.INT64), ("score", FeatureType.FLOAT), ("name", FeatureType.BYTES)]
values = [[-(2**63), 2**63 - 1, 0], [0.5, -2.0], ["na\\u00efve \\U0001f600", b"\\x00"]]
data = ExampleWriter(features).encode(values)

ours = tfrecordd.format.proto.Example.FromString(data)
assert ours.features.feature["id"].int64_list.value == values[0]

theirs = tf.train.Example.FromString(data)
expected = tf.train.Example(
    features=tf.train.Features(
        feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=values[0])),
            "score": tf.train.Feature(float_list=tf.train.FloatList(value=values[1])),
            "name": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=["na\\u00efve \\U0001f600".encode(), b"\\x00"])
            ),
        }
    )
)
assert theirs == expected, theirs
print("same message")
"""

ORDERS = {
    "tfrecordd first": "import tfrecordd.format.proto\nimport tensorflow as tf\n",
    "tensorflow first": "import tensorflow as tf\nimport tfrecordd.format.proto\n",
}


@pytest.mark.tensorflow
@pytest.mark.parametrize("order", list(ORDERS))
def test_both_import_orders_work(order: str) -> None:
    pytest.importorskip("tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", ORDERS[order] + CHECK],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("same message")
