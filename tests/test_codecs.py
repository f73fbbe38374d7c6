"""Tests for miita_edge.memory.codecs: error bounds, idempotence, byte counts, zero vectors.

References are re-derived here in plain numpy (IEEE rounding of float16, sign bits,
max-abs/127 quantisation) and byte counts are read from the encoded arrays' own
``nbytes``, never from the codec's arithmetic.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miita_edge.memory import codecs
PRECISIONS = ["float32", "float16", "int8", "bit"]
F16_TINY = 2.0 ** -25  # half the float16 subnormal spacing


@st.composite
def matrices(draw, max_rows=6, max_cols=70):
    """(n, H) float32 with mixed magnitudes, exact zeros and all-zero rows; finite, no subnormals."""
    n = draw(st.integers(0, max_rows))
    H = draw(st.integers(1, max_cols))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mag = 10.0 ** rng.uniform(-6, 4, size=(n, 1))
    x = (rng.standard_normal((n, H)) * mag).astype(np.float32)
    x[rng.random((n, H)) < 0.15] = 0.0
    if n and draw(st.booleans()):
        x[draw(st.integers(0, n - 1))] = 0.0
    return x


def _encoded_nbytes(enc: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in enc.values())


def _same_bytes(e1: dict[str, np.ndarray], e2: dict[str, np.ndarray]) -> bool:
    return e1.keys() == e2.keys() and all(
        e1[k].dtype == e2[k].dtype and e1[k].shape == e2[k].shape and e1[k].tobytes() == e2[k].tobytes()
        for k in e1)


# ------------------------------------------------------------------ error bounds


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_float32_is_exact(x):
    y = codecs.roundtrip(x, "float32")
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.array_equal(y, x)


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_float16_error_is_half_an_ulp(x):
    y = codecs.roundtrip(x, "float16")
    assert y.dtype == np.float32 and y.shape == x.shape
    # round-to-nearest in binary16: relative error <= 2^-11 for normals, <= 2^-25 absolute below
    bound = np.maximum(np.abs(x).astype(np.float64) * 2.0 ** -11, F16_TINY)
    assert np.all(np.abs(y.astype(np.float64) - x) <= bound)


@settings(max_examples=80, deadline=None)
@given(matrices())
def test_int8_error_at_most_half_a_step(x):
    enc = codecs.encode(x, "int8")
    y = codecs.decode(enc, "int8", x.shape[1])
    assert y.shape == x.shape
    amax = np.abs(x.astype(np.float64)).max(axis=1) if x.size else np.zeros(len(x))
    ref_scale = amax / 127.0
    # the stored scale is max-abs / 127 (to float32 rounding)
    assert np.allclose(enc["scale"], ref_scale, rtol=1e-6, atol=0)
    # |x - q*scale| <= scale/2 per component (plus float32 rounding of x/scale and q*scale)
    slack = ref_scale * 1e-5 + amax * 1e-7
    err = np.abs(y.astype(np.float64) - x)
    assert np.all(err <= (ref_scale / 2 + slack)[:, None])
    assert np.all(np.abs(enc["data"].astype(np.int64)) <= 127)


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_bit_decodes_to_sign(x):
    y = codecs.roundtrip(x, "bit")
    assert y.shape == x.shape
    ref = np.where(x >= 0, 1.0, -1.0)  # zero maps to +1 (the codec's documented convention)
    assert np.array_equal(y, ref)
    nz = x != 0
    assert np.array_equal(y[nz], np.sign(x[nz]))


# ------------------------------------------------------------------ idempotence and sizes


@pytest.mark.parametrize("precision", PRECISIONS)
@settings(max_examples=40, deadline=None)
@given(x=matrices())
def test_encode_is_idempotent(precision, x):
    e1 = codecs.encode(x, precision)
    e2 = codecs.encode(codecs.roundtrip(x, precision), precision)
    assert _same_bytes(e1, e2)
    # and the decoded value is a fixed point
    y = codecs.roundtrip(x, precision)
    assert np.array_equal(codecs.roundtrip(y, precision), y)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("H", [1, 7, 8, 9, 16, 64, 65])
def test_bytes_per_vector_matches_encoded_nbytes(precision, H):
    rng = np.random.default_rng(H)
    for n in (1, 3):
        enc = codecs.encode(rng.standard_normal((n, H)).astype(np.float32), precision)
        assert _encoded_nbytes(enc) == n * codecs.bytes_per_vector(precision, H)
    ref = {"float32": 4 * H, "float16": 2 * H, "int8": H + 4, "bit": -(-H // 8)}[precision]
    assert codecs.bytes_per_vector(precision, H) == ref


@pytest.mark.parametrize("precision", PRECISIONS)
def test_encoded_dtypes_and_shapes(precision):
    H = 13
    x = np.random.default_rng(0).standard_normal((4, H)).astype(np.float32)
    enc = codecs.encode(x, precision)
    want = {"float32": ({"data": ((4, H), np.float32)}),
            "float16": ({"data": ((4, H), np.float16)}),
            "int8": ({"data": ((4, H), np.int8), "scale": ((4,), np.float32)}),
            "bit": ({"data": ((4, 2), np.uint8)})}[precision]
    assert {k: (v.shape, v.dtype) for k, v in enc.items()} == {k: (s, np.dtype(d)) for k, (s, d) in want.items()}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("H", [1, 8, 16, 19])
def test_zero_vectors(precision, H):
    x = np.zeros((3, H), np.float32)
    enc = codecs.encode(x, precision)
    y = codecs.decode(enc, precision, H)
    assert np.all(np.isfinite(y))
    if precision == "bit":
        assert np.array_equal(y, np.ones((3, H)))  # sign(0) stored as +1
    else:
        assert np.array_equal(y, x)
    if precision == "int8":
        assert np.array_equal(enc["scale"], np.zeros(3, np.float32))
    assert _same_bytes(codecs.encode(y, precision), enc)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_empty_batch(precision):
    x = np.zeros((0, 16), np.float32)
    enc = codecs.encode(x, precision)
    assert _encoded_nbytes(enc) == 0
    assert codecs.decode(enc, precision, 16).shape == (0, 16)


def test_int8_hand_example():
    x = np.array([[127.0, -63.4, 0.6, 0.0, -127.0]], np.float32)
    enc = codecs.encode(x, "int8")
    assert enc["scale"][0] == np.float32(1.0)
    assert enc["data"].tolist() == [[127, -63, 1, 0, -127]]


def test_bit_hand_example():
    x = np.array([[1.0, -2.0, 0.0, -0.5, 3.0, 4.0, -1.0, 2.0, -9.0]], np.float32)
    enc = codecs.encode(x, "bit")
    # MSB-first packing of (x >= 0): 1 0 1 0 1 1 0 1 | 0
    assert enc["data"].tolist() == [[0b10101101, 0b00000000]]
    assert codecs.decode(enc, "bit", 9).tolist() == [[1, -1, 1, -1, 1, 1, -1, 1, -1]]


def test_unknown_precision_raises():
    with pytest.raises(ValueError):
        codecs.encode(np.zeros((1, 4)), "int4")
    with pytest.raises(ValueError):
        codecs.decode({"data": np.zeros((1, 4))}, "int4", 4)
