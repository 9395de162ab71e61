"""Example and SequenceExample message classes that never clash with TensorFlow.

TensorFlow registers ``tensorflow.Example`` and friends in protobuf's default descriptor pool.
Registering the same names there again fails ("duplicate symbol 'tensorflow.BytesList'"), in
whichever order the two are imported. These classes are built from the same message definitions
(``tensorflow/core/example/{example,feature}.proto``) in a descriptor pool of tfrecordd's own, so
they parse and serialize exactly the same wire format without touching the default pool.

The daemon's hot path never builds these messages; they are the decoder of the reader tools and
the oracle of the tests.
"""

from __future__ import annotations

import base64
import contextlib
import math
import struct
from typing import Any, cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as _ProtoDecodeError
from google.protobuf.message import Message

from tfrecordd.errors import DecodeError
from tfrecordd.format import tfreading

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="tfrecordd/example.proto", package="tensorflow", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> Any:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        return m

    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    message("BytesList", ("value", 1, _F.TYPE_BYTES, rep, None))
    message("FloatList", ("value", 1, _F.TYPE_FLOAT, rep, None))
    message("Int64List", ("value", 1, _F.TYPE_INT64, rep, None))
    feature = message(
        "Feature",
        ("bytes_list", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
        ("float_list", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
        ("int64_list", 3, _F.TYPE_MESSAGE, opt, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0

    def map_of(owner: Any, entry: str, value_type: str) -> None:
        e = owner.nested_type.add(name=entry)
        e.options.map_entry = True
        e.field.add(name="key", number=1, type=_F.TYPE_STRING, label=opt)
        e.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, label=opt, type_name=value_type)

    features = message(
        "Features", ("feature", 1, _F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry")
    )
    map_of(features, "FeatureEntry", ".tensorflow.Feature")
    message("FeatureList", ("feature", 1, _F.TYPE_MESSAGE, rep, ".tensorflow.Feature"))
    lists = message(
        "FeatureLists",
        ("feature_list", 1, _F.TYPE_MESSAGE, rep, ".tensorflow.FeatureLists.FeatureListEntry"),
    )
    map_of(lists, "FeatureListEntry", ".tensorflow.FeatureList")
    message("Example", ("features", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.Features"))
    message(
        "SequenceExample",
        ("context", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.Features"),
        ("feature_lists", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.FeatureLists"),
    )
    return fd


POOL = descriptor_pool.DescriptorPool()
"""tfrecordd's own descriptor pool: never protobuf's default one, which TensorFlow uses."""
POOL.Add(_file())


def _cls(name: str) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(
        POOL.FindMessageTypeByName(f"tensorflow.{name}")
    )
    return cls


BytesList = _cls("BytesList")
FloatList = _cls("FloatList")
Int64List = _cls("Int64List")
Feature = _cls("Feature")
Features = _cls("Features")
FeatureList = _cls("FeatureList")
FeatureLists = _cls("FeatureLists")
Example = _cls("Example")
SequenceExample = _cls("SequenceExample")

FeatureValues = list[int] | list[float] | list[bytes]


def feature_values(feature: Any) -> FeatureValues:
    """The values of one ``Feature`` message as a plain list (empty when no kind is set)."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return []
    return list(getattr(feature, kind).value)


def parse_example(data: bytes) -> dict[str, FeatureValues]:
    """Parse a serialized ``Example`` into ``{feature name: list of values}``.

    A key that is not UTF-8, which ``tf.io.parse_example`` reads and protobuf's ``string``
    refuses, is read too (``passthrough`` with ``unknown_fields = "keep"`` writes such records):
    decoded with ``surrogateescape``, so ``key.encode("utf-8", "surrogateescape")`` gives its
    bytes back."""
    msg: Any = Example()
    try:
        msg.ParseFromString(data)
    except _ProtoDecodeError as e:
        try:
            reading = tfreading.protobuf_reading(bytes(data))
        except tfreading.WireError:
            raise DecodeError(f"not a serialized Example: {e}") from e
        return {
            key.decode("utf-8", "surrogateescape"): _plain(kind, values)
            for key, (kind, values) in reading.features.items()
        }
    return {k: feature_values(v) for k, v in msg.features.feature.items()}


def _plain(kind: int | None, values: tuple[object, ...]) -> FeatureValues:
    """Values as :func:`~tfrecordd.format.tfreading.protobuf_reading` gives them, as protobuf
    would."""
    if kind == 2:  # float bit patterns
        return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}I", *values)))
    if kind == 3:  # unsigned 64-bit
        ints = [cast(int, v) for v in values]
        return [v - (1 << 64) if v >= 1 << 63 else v for v in ints]
    return [cast(bytes, v) for v in values]


def parse_sequence_example(
    data: bytes,
) -> tuple[dict[str, FeatureValues], dict[str, list[FeatureValues]]]:
    """Parse a serialized ``SequenceExample`` into ``(context, feature_lists)`` of plain lists."""
    msg: Any = SequenceExample()
    try:
        msg.ParseFromString(data)
    except _ProtoDecodeError as e:
        raise DecodeError(f"not a serialized SequenceExample: {e}") from e
    context = {k: feature_values(v) for k, v in msg.context.feature.items()}
    lists = {
        k: [feature_values(f) for f in v.feature] for k, v in msg.feature_lists.feature_list.items()
    }
    return context, lists


def float32_repr(value: float) -> float:
    """The shortest decimal that reads back as the same 32-bit float (``4.9``, not
    ``4.900000095367432``): how a FloatList value was most likely written."""
    if not math.isfinite(value):
        return value
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        with contextlib.suppress(OverflowError):
            if struct.pack("<f", short) == packed:
                return short
    return value


def jsonable(values: FeatureValues) -> list[Any]:
    """Values made JSON-safe: bytes as UTF-8 text where valid, else ``{"base64": "..."}``;
    floats (always 32-bit in an Example) in their shortest exact form."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, bytes):
            try:
                out.append(v.decode("utf-8"))
            except UnicodeDecodeError:
                out.append({"base64": base64.b64encode(v).decode("ascii")})
        elif isinstance(v, float):
            out.append(float32_repr(v))
        else:
            out.append(v)
    return out
