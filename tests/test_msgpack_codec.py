"""MessagePack ndarray conventions (docs/formats.md, "MessagePack"): native kernel == msgpack.packb reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eva._native import load
from eva.dataset import msgpack_codec as codec

pytestmark = pytest.mark.kernels

_native = load("msgpack_image")

DTYPES = st.sampled_from(
    ["|u1", "|i1", "<u2", ">u2", "<i4", "<u4", "<i8", "<f2", "<f4", ">f4", "<f8", "|b1", "<c8"]
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=7)


def spec_bytes(array: np.ndarray) -> bytes:
    """The contract's map packed by msgpack itself, data via tobytes(): the ground truth."""
    return msgpack.packb(
        {
            "__ndarray__": True,
            "data": array.tobytes(),
            "dtype": array.dtype.str,
            "shape": list(array.shape),
        }
    )


def native_encode(array: np.ndarray) -> bytes:
    assert _native is not None
    return _native.encode(array)


def native_encode_into(array: np.ndarray) -> bytes:
    assert _native is not None
    out = bytearray(_native.size(array) + 7)
    n = _native.encode_into(array, out, 3)
    return bytes(out[3 : 3 + n])


def reference_encode_into(array: np.ndarray) -> bytes:
    out = bytearray(codec.encoded_ndarray_size_reference(array) + 7)
    n = codec.encode_ndarray_into_reference(array, out, 3)
    return bytes(out[3 : 3 + n])


ENCODERS: dict[str, Callable[[np.ndarray], bytes]] = {
    "native": native_encode,
    "native_into": native_encode_into,
    "reference": codec.encode_ndarray_reference,
    "reference_into": reference_encode_into,
    "public": codec.encode_ndarray,
}


@pytest.fixture(scope="module", params=list(ENCODERS))
def encoder(request: pytest.FixtureRequest) -> Callable[[np.ndarray], bytes]:
    return ENCODERS[request.param]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_encoders_are_byte_identical_to_msgpack(
    encoder: Callable[[np.ndarray], bytes], data: st.DataObject
) -> None:
    array = data.draw(hnp.arrays(dtype=data.draw(DTYPES), shape=SHAPES))
    assert encoder(array) == spec_bytes(array)


@pytest.mark.parametrize(
    "shape", [(48, 64, 3), (1, 255), (1, 256), (65535,), (65536,), (300,) * 1 + (300,)]
)
def test_bin_and_int_width_boundaries(
    encoder: Callable[[np.ndarray], bytes], shape: tuple[int, ...]
) -> None:
    # Covers bin8/bin16/bin32 headers and fixint/uint8/uint16 shape entries.
    array = np.arange(int(np.prod(shape)), dtype=np.uint32).astype(np.uint8).reshape(shape)
    assert encoder(array) == spec_bytes(array)


def test_many_dims_and_long_dtype_string(encoder: Callable[[np.ndarray], bytes]) -> None:
    array = np.zeros((1,) * 17, dtype="<M8[ns]")  # array16 header, 7-char dtype str
    assert encoder(array) == spec_bytes(array)


def test_non_contiguous_input_is_encoded_in_c_order(
    encoder: Callable[[np.ndarray], bytes],
) -> None:
    array = np.arange(60, dtype=np.int16).reshape(3, 4, 5).transpose(2, 0, 1)[::2]
    assert not array.flags.c_contiguous
    assert encoder(array) == spec_bytes(np.ascontiguousarray(array))


def test_object_dtype_is_refused(encoder: Callable[[np.ndarray], bytes]) -> None:
    with pytest.raises(TypeError, match="dtype"):
        encoder(np.array([1, "x"], dtype=object))


def test_small_output_buffer_is_refused() -> None:
    array = np.ones((4, 4, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="cannot hold"):
        codec.encode_ndarray_into_reference(array, bytearray(10))
    if _native is not None:
        with pytest.raises(ValueError, match="cannot hold"):
            _native.encode_into(array, bytearray(10))
        with pytest.raises(ValueError, match="cannot hold"):
            _native.encode_into(array, bytearray(1000), 990)


DECODERS: dict[str, Callable[[Any], np.ndarray]] = {
    "public": codec.decode_ndarray,
    "reference": codec.decode_ndarray_reference,
}


@pytest.mark.parametrize("decoder", list(DECODERS))
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_decode_round_trips(decoder: str, data: st.DataObject) -> None:
    array = data.draw(hnp.arrays(dtype=data.draw(DTYPES), shape=SHAPES))
    decoded = DECODERS[decoder](spec_bytes(array))
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()


def test_native_decode_is_a_zero_copy_view_of_the_payload() -> None:
    frame = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    payload = spec_bytes(frame)
    decoded = codec.decode_ndarray(payload)
    np.testing.assert_array_equal(decoded, frame)
    if _native is not None:
        assert np.shares_memory(decoded, np.frombuffer(payload, dtype=np.uint8))


def test_decode_accepts_bin_keys_and_any_key_order() -> None:
    # openpi's packer uses bytes keys; msgpack-numpy-like writers may order keys differently.
    frame = np.arange(24, dtype="<f4").reshape(2, 3, 4)
    for payload in (
        msgpack.packb(
            {
                b"__ndarray__": True,
                b"data": frame.tobytes(),
                b"dtype": frame.dtype.str,
                b"shape": frame.shape,
            }
        ),
        msgpack.packb(
            {
                "shape": [2, 3, 4],
                "dtype": "<f4",
                "data": frame.tobytes(),
                "__ndarray__": True,
            }
        ),
    ):
        np.testing.assert_array_equal(codec.decode_ndarray(payload), frame)
        np.testing.assert_array_equal(codec.decode_ndarray_reference(payload), frame)


def test_decode_refuses_a_payload_that_is_not_an_ndarray() -> None:
    with pytest.raises(ValueError, match="not an ndarray"):
        codec.decode_ndarray(msgpack.packb({"a": 1}))


def test_decode_refuses_data_that_is_not_whole_items() -> None:
    payload = msgpack.packb(
        {"__ndarray__": True, "data": b"\x00" * 7, "dtype": "<f4", "shape": [1]}
    )
    with pytest.raises(ValueError):
        codec.decode_ndarray(payload)


def test_packb_nested_values_round_trip() -> None:
    value = {
        "state": np.arange(6, dtype=np.float32).reshape(3, 2),
        "scalar": np.float64(2.5),
        "flag": np.bool_(True),
        "count": np.int64(7),
        "text": "héllo",
        "raw": b"\x00\x01",
        "tuple": (1, 2),
        "nested": {"list": [1, None, 2.0]},
    }
    packed = codec.packb(value)
    decoded = codec.unpackb(packed)
    np.testing.assert_array_equal(decoded["state"], value["state"])
    assert decoded["scalar"] == 2.5 and decoded["scalar"].dtype == np.float64
    assert decoded["flag"] is np.True_
    assert decoded["count"] == 7 and decoded["count"].dtype == np.int64
    assert decoded["text"] == "héllo" and decoded["raw"] == b"\x00\x01"
    assert decoded["tuple"] == [1, 2]
    assert decoded["nested"] == {"list": [1, None, 2.0]}
    # A numpy scalar is the npgeneric map, not a plain float (np.float64 subclasses float).
    raw = msgpack.unpackb(packed)
    assert raw["scalar"] == {
        "__npgeneric__": True,
        "data": value["scalar"].tobytes(),
        "dtype": "<f8",
    }
    # The nested ndarray uses the same bytes as the image kernel.
    assert codec.packb(value["state"]) == spec_bytes(value["state"])


def test_unpackb_reads_plain_msgpack() -> None:
    assert codec.unpackb(msgpack.packb({"a": [1, 2, {"b": "c"}]})) == {"a": [1, 2, {"b": "c"}]}
