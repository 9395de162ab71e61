"""``passthrough`` against TensorFlow's own parser, over generated wire-format variants.

The oracle is independent of :mod:`tfrecordd.format.tfreading`: real
``tf.io.parse_example`` (with a spec naming every key the record was built with, as ``bytes``,
with each of the three kinds) and protobuf itself, parsing into messages declared here with
``bytes`` keys and a repeated entry list (the wire format of ``Features``, so a key that is not
UTF-8 parses and every entry is seen). The rules held, for both modes and with and without the
compiled check:

- nothing accepted fails ``tf.io.parse_example``, nor is read by it otherwise than protobuf reads
  it ("garbage");
- ``keep`` accepts everything TensorFlow reads that is not garbage;
- ``reject`` accepts exactly what ``keep`` accepts that holds no unknown field and no key that
  is not UTF-8.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecordd.format import compiled, proto
from tfrecordd.plugin import RawEvent
from tfrecordd_plugins.encoders.passthrough import PassthroughEncoderConfig

pytestmark = pytest.mark.tensorflow

Reading = dict[bytes, tuple[str | None, tuple[Any, ...]]]


@pytest.fixture(scope="module")
def tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def _lenient_example_class() -> Any:
    """``Example`` with ``Features`` as a repeated ``{bytes key; Feature value}``: its wire
    format, with keys that need not be UTF-8 and repeated keys kept apart."""
    file = descriptor_pb2.FileDescriptorProto(name="lenient_example.proto", package="lenient")
    file.syntax = "proto3"
    label, t = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> Any:
        m = file.message_type.add(name=name)
        for fname, number, ftype, flabel, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=flabel)
            if type_name:
                f.type_name = f".lenient.{type_name}"
        return m

    rep, opt = label.LABEL_REPEATED, label.LABEL_OPTIONAL
    message("BytesList", ("value", 1, t.TYPE_BYTES, rep, None))
    message("FloatList", ("value", 1, t.TYPE_FIXED32, rep, None))  # bit patterns
    message("Int64List", ("value", 1, t.TYPE_UINT64, rep, None))
    feature = message(
        "Feature",
        ("bytes_list", 1, t.TYPE_MESSAGE, opt, "BytesList"),
        ("float_list", 2, t.TYPE_MESSAGE, opt, "FloatList"),
        ("int64_list", 3, t.TYPE_MESSAGE, opt, "Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    message(
        "Entry", ("key", 1, t.TYPE_BYTES, opt, None), ("value", 2, t.TYPE_MESSAGE, opt, "Feature")
    )
    message("Features", ("feature", 1, t.TYPE_MESSAGE, rep, "Entry"))
    message("Example", ("features", 1, t.TYPE_MESSAGE, opt, "Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("lenient.Example"))


LenientExample = _lenient_example_class()
KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def protobuf_reading(data: bytes) -> tuple[Reading, bool] | None:
    """Protobuf's reading (the last entry of a key wins) and whether it saw unknown fields, or
    ``None`` if protobuf does not parse it or it gives a key twice with different values."""
    msg = LenientExample()
    try:
        msg.ParseFromString(data)
    except Exception:
        return None
    reading: Reading = {}
    values_of: dict[bytes, bytes] = {}
    for entry in msg.features.feature:
        value = entry.value.SerializeToString(deterministic=True)
        if values_of.setdefault(entry.key, value) != value:
            # A key given twice with different values: a FixedLenFeature and a VarLenFeature do
            # not read the same entry of it (garbage, for this oracle).
            return None
        kind = entry.value.WhichOneof("kind")
        values = tuple(getattr(entry.value, kind).value) if kind else ()
        reading.pop(entry.key, None)
        reading[entry.key] = (KINDS[kind] if kind else None, values)
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return reading, msg.ByteSize() != size


def tensorflow_reading(tf: Any, data: bytes, keys: set[bytes]) -> Reading | None:
    """What ``tf.io.parse_example`` reads for each key (the kind whose spec parses: ``None`` if
    all do), or ``None`` if it fails whatever the spec."""
    dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}

    def parse(spec: dict[bytes, Any]) -> Any:
        try:
            return tf.io.parse_example([data], spec)
        except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
            # (TensorFlow's message quotes the record, and Python may fail to decode it.)
            return None

    if parse({b"\x00absent": tf.io.VarLenFeature(tf.int64)}) is None:
        return None
    reading: Reading = {}
    for key in keys:
        read = {}
        for kind, dtype in dtypes.items():
            out = parse({key: tf.io.VarLenFeature(dtype)})
            if out is not None:
                read[kind] = out[key].values.numpy().tolist()
        if not read:
            return None
        if len(read) == 3:
            reading[key] = (None, ())
        else:
            ((kind, values),) = read.items()
            if kind == "float":
                values = [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
            elif kind == "int64":
                values = [v & (2**64 - 1) for v in values]
            reading[key] = (kind, tuple(values))
    return reading


# --- the wire format by hand -----------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= 2**64 - 1
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


UNKNOWN_FIELDS = [
    b"\x20\x01",  # field 4, varint
    b"\x25\x00\x00\x80\x3f",  # field 4, fixed32
    b"\x21" + b"\x00" * 8,  # field 4, fixed64
    ld(4, b"xyz"),  # field 4, length-delimited
    b"\x23\x08\x01\x24",  # field 4, a group holding a varint
    b"\x08\x05",  # field 1 as a varint (the wrong wire type)
    b"\x02\x00",  # field number 0
    b"\x26",  # wire type 6
    b"\xa2\x06\x00",  # field 100, length-delimited, a two-byte tag
]

int64_st = st.integers(-(2**63), 2**63 - 1)
float_bits_st = st.one_of(
    st.floats(width=32).map(lambda f: struct.pack("<f", f)), st.binary(min_size=4, max_size=4)
)


@st.composite
def value_list_st(draw: st.DrawFn, kind: int) -> bytes:
    """The body of a ``BytesList`` (1), ``FloatList`` (2) or ``Int64List`` (3), in a form that
    is valid, or one TensorFlow or protobuf reads otherwise or refuses."""
    if kind == 1:
        body = b"".join(ld(1, v) for v in draw(st.lists(st.binary(max_size=6), max_size=3)))
    elif kind == 2:
        floats = draw(st.lists(float_bits_st, max_size=3))
        form = draw(st.sampled_from(["packed", "unpacked", "odd", "split", "mixed"]))
        if form == "packed":
            body = ld(1, b"".join(floats)) if floats else b""
        elif form == "unpacked":
            body = b"".join(b"\x0d" + f for f in floats)
        elif form == "odd":  # a packed length that is not a multiple of 4
            body = ld(1, b"".join(floats) + draw(st.binary(min_size=1, max_size=3)))
        elif form == "split":
            body = ld(1, b"".join(floats)) + ld(1, b"".join(floats[:1]))
        else:
            body = b"".join(b"\x0d" + f for f in floats) + ld(1, b"".join(floats))
    else:
        ints = [varint(v) for v in draw(st.lists(int64_st, max_size=3))]
        form = draw(st.sampled_from(["packed", "unpacked", "split", "mixed", "long"]))
        if form == "packed":
            body = ld(1, b"".join(ints)) if ints else b""
        elif form == "unpacked":
            body = b"".join(b"\x08" + v for v in ints)
        elif form == "split":
            body = ld(1, b"".join(ints)) + ld(1, b"".join(ints[:1]))
        elif form == "mixed":
            body = ld(1, b"".join(ints)) + b"".join(b"\x08" + v for v in ints)
        else:  # a varint of 10 bytes whose last one sets bits past the 64th, or of 11
            body = ld(
                1, b"\xff" * 9 + draw(st.sampled_from([b"\x01", b"\x02", b"\x7f", b"\x80\x01"]))
            )
    if draw(st.integers(0, 5)) == 0:
        unknown = draw(st.sampled_from(UNKNOWN_FIELDS))
        body = unknown + body if draw(st.booleans()) else body + unknown
    return body


@st.composite
def feature_st(draw: st.DrawFn) -> bytes:
    """A ``Feature``: no kind, one, or several; with unknown fields before or after."""
    parts = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2]))):
        kind = draw(st.integers(1, 3))
        parts.append(ld(kind, draw(value_list_st(kind))))
    body = b"".join(parts)
    if draw(st.integers(0, 5)) == 0:
        unknown = draw(st.sampled_from(UNKNOWN_FIELDS))
        body = unknown + body if draw(st.booleans()) else body + unknown
    return body


keys_st = st.one_of(
    st.sampled_from([b"a", b"b", b"id", b"", "é".encode()]),
    st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"ab\xe2\x82"]),  # not UTF-8
)


@st.composite
def entry_st(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """``(key, map entry body)``: a key and a value in either order, or one of them missing or
    given twice, or an unknown field beside them."""
    key, feature = draw(keys_st), draw(feature_st())
    shape = draw(
        st.sampled_from(
            ["kv", "kv", "kv", "kv", "vk", "k", "v", "", "kkv", "kvv", "kv+", "+kv", "k=v"]
        )
    )
    if shape == "k=v":  # the value with another wire type
        return key, ld(1, key) + b"\x10\x01"
    parts = {"k": ld(1, key), "v": ld(2, feature), "+": draw(st.sampled_from(UNKNOWN_FIELDS))}
    return key, b"".join(parts[c] for c in shape)


@st.composite
def example_st(draw: st.DrawFn) -> tuple[bytes, set[bytes]]:
    """A serialized Example and the keys it was built with."""
    keys: set[bytes] = set()
    top = []
    for _ in range(draw(st.integers(0, 2))):
        entries = []
        for _ in range(draw(st.integers(0, 3))):
            key, entry = draw(entry_st())
            keys.add(key)
            entries.append(ld(1, entry))
        if draw(st.integers(0, 7)) == 0:
            entries.insert(
                draw(st.integers(0, len(entries))), draw(st.sampled_from(UNKNOWN_FIELDS))
            )
        features = b"".join(entries)
        # Now and then the features field with a two-byte tag (TensorFlow skips it).
        top.append(
            b"\x8a\x00" + varint(len(features)) + features
            if draw(st.integers(0, 15)) == 0
            else ld(1, features)
        )
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        top.insert(draw(st.integers(0, len(top))), draw(st.sampled_from(UNKNOWN_FIELDS)))
    data = b"".join(top)
    if data and draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data, keys


# --- the rules ---------------------------------------------------------------------------------


def accepted(data: bytes, unknown_fields: str) -> bool:
    config = PassthroughEncoderConfig(unknown_fields=unknown_fields)  # type: ignore[arg-type]
    result = config.build().encode_batch([RawEvent(data, "e")])
    assert result.records in ([], [data])
    return result.records == [data]


def verdicts(data: bytes) -> dict[str, bool]:
    return {mode: accepted(data, mode) for mode in ("keep", "reject")}


def check_against_tensorflow(tf: Any, data: bytes, keys: set[bytes]) -> dict[str, bool]:
    pb = protobuf_reading(data)
    tf_read = tensorflow_reading(tf, data, keys | (set(pb[0]) if pb else set()))
    garbage = pb is None or tf_read is None or any(tf_read[k] != pb[0][k] for k in pb[0])
    got = verdicts(data)
    for mode, ok in got.items():
        if ok:
            assert tf_read is not None, f"{mode} accepts what tf.io.parse_example fails on"
            assert not garbage, f"{mode} accepts what TensorFlow reads otherwise than protobuf"
    if tf_read is not None and not garbage:
        assert got["keep"], "keep refuses what TensorFlow reads"
    assert pb is not None or not got["keep"]
    strict_ok = pb is not None and not pb[1] and all(_utf8(k) for k in pb[0])
    assert got["reject"] == (got["keep"] and strict_ok)
    if got["keep"]:
        # tfrecordd's own reader reads what was accepted as TensorFlow does (keys not UTF-8 too).
        assert tf_read is not None
        assert pb is not None
        # (A key with no values and no key at all read the same.)
        assert _as_tensorflow_reads(proto.parse_example(data)) == {
            k: v for k, (_, v) in tf_read.items() if k in pb[0] and v
        }
    return got


def _as_tensorflow_reads(parsed: dict[str, Any]) -> dict[bytes, tuple[Any, ...]]:
    out = {}
    for key, values in parsed.items():
        if values and isinstance(values[0], float):
            values = [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
        elif values and isinstance(values[0], int):
            values = [v & (2**64 - 1) for v in values]
        if values:
            out[key.encode("utf-8", "surrogateescape")] = tuple(values)
    return out


def _utf8(key: bytes) -> bool:
    try:
        key.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(params=["compiled", "python"])
def check_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(compiled, "COMPILED", False)
    elif not compiled.COMPILED:
        pytest.skip("tfrecordd._cframe is not built")
    return str(request.param)


DIFFERENTIAL = settings(
    max_examples=int(os.environ.get("TFA_N", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@DIFFERENTIAL
@given(example_st())
def test_passthrough_agrees_with_tensorflow_on_generated_variants(
    tf: Any, check_path: str, case: tuple[bytes, set[bytes]]
) -> None:
    check_against_tensorflow(tf, *case)


def _entry(key: bytes, feature: bytes) -> bytes:
    return ld(1, ld(1, key) + ld(2, feature))


INT64 = ld(3, ld(1, varint(7)))
GOOD = _entry(b"a", INT64)

# The disagreements of the issue, each with what each mode must now do (keep, reject).
KNOWN = [
    ("entry without a key", ld(1, ld(1, ld(2, INT64))), False, False),
    ("entry without a value", ld(1, ld(1, ld(1, b"a"))), False, False),
    ("group in an Example", ld(1, GOOD) + b"\x0b\x0c", False, False),
    ("group in a map entry", ld(1, ld(1, ld(1, b"a") + ld(2, INT64) + b"\x1b\x1c")), False, False),
    ("key not UTF-8", ld(1, _entry(b"\xff", INT64)), True, False),
    ("unknown field on the Example", ld(1, GOOD) + b"\x10\x01", True, False),
    ("unknown field in a Feature", ld(1, _entry(b"a", INT64 + b"\x20\x01")), True, False),
    ("a varint where features should be", b"\x08\x05" + ld(1, GOOD), True, False),
    ("packed floats, 5 bytes", ld(1, _entry(b"a", ld(2, ld(1, b"\x00" * 5)))), False, False),
    ("a Feature with two kinds", ld(1, _entry(b"a", INT64 + ld(1, ld(1, b"x")))), False, False),
    ("a key twice", ld(1, GOOD + _entry(b"a", ld(1, ld(1, b"x")))), False, False),
    ("a key twice, same value", ld(1, GOOD + GOOD), True, True),
    (
        "unpacked floats, then an unknown field",
        ld(1, _entry(b"a", ld(2, b"\x0d" + bytes(4) + b"\x20\x01"))),
        False,
        False,
    ),
    (
        "a packed list, then an unknown field",
        ld(1, _entry(b"a", ld(3, ld(1, b"\x07") + b"\x20\x01"))),
        True,
        False,
    ),
    ("well formed", ld(1, GOOD), True, True),
]


@pytest.mark.parametrize(("what", "data", "keep", "reject"), KNOWN, ids=[k[0] for k in KNOWN])
def test_known_disagreements(
    tf: Any, check_path: str, what: str, data: bytes, keep: bool, reject: bool
) -> None:
    got = check_against_tensorflow(tf, data, {b"a", b"\xff"})
    assert got == {"keep": keep, "reject": reject}


def test_refusals_say_why() -> None:
    def reason(data: bytes, mode: str) -> str:
        config = PassthroughEncoderConfig(unknown_fields=mode)  # type: ignore[arg-type]
        ((_, what, why),) = config.build().encode_batch([RawEvent(data, "e")]).failures
        assert what == "malformed"
        return why

    assert "not a multiple of 4" in reason(KNOWN[8][1], "keep")
    assert "without a key or without a value" in reason(KNOWN[0][1], "keep")
    assert "an int64_list of 1 value to TensorFlow, a bytes_list" in reason(KNOWN[9][1], "keep")
    assert "not UTF-8" in reason(KNOWN[4][1], "reject")
