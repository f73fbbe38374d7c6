"""The native per-row steering (Engine.set_steer with an (R, H) direction) against numpy, on a
result_norm tensor made with ggml itself and handed to the eval callback: no model is loaded."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from miita_edge.native import ext
from miita_edge.runtime.abi import ggml_library

GGML_TYPE_F32 = 0
OFF, UNGATED, GATED = 0, 1, 2


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    lib = ggml_library()
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_init.argtypes = [_InitParams]
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    lib.ggml_new_tensor_2d.restype = ctypes.c_void_p
    lib.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.ggml_set_name.restype = ctypes.c_void_p
    lib.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_get_data.restype = ctypes.c_void_p
    lib.ggml_get_data.argtypes = [ctypes.c_void_p]
    return lib


def run_callback(ggml, st, h: np.ndarray) -> np.ndarray:
    """result_norm rows ``h`` (R, H) after the callback has seen them (asked, then computed)."""
    ctx = ggml.ggml_init(_InitParams(1 << 20, None, False))
    try:
        t = ggml.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, h.shape[1], h.shape[0])
        ggml.ggml_set_name(t, b"result_norm")
        data = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float)), shape=h.shape)
        data[:] = h
        cb = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(ext.callback_address())
        assert cb(t, True, st.user_data) is True  # the callback asks for result_norm while steering is on
        assert cb(t, False, st.user_data) is True
        return data.copy()
    finally:
        ggml.ggml_free(ctx)


def reference(h, dirs, h_q, eta, gated):
    """Eq. 11 per row in float64: h_r + eta·α_r·d_r, α_r = max(0, cos(h_r, h_q)) or 1."""
    h = h.astype(np.float64)
    if gated:
        alpha = np.maximum(0.0, h @ h_q / (np.linalg.norm(h, axis=1) * np.linalg.norm(h_q)))
    else:
        alpha = np.ones(len(h))
    return h + eta * alpha[:, None] * dirs.astype(np.float64), alpha


@pytest.mark.parametrize("mode", [GATED, UNGATED])
def test_each_row_adds_its_own_direction(ggml, mode):
    rng = np.random.default_rng(3)
    R, H = 5, 48
    h = rng.standard_normal((R, H)).astype(np.float32)
    dirs = rng.standard_normal((R, H)).astype(np.float32)
    dirs[2] = 0.0  # a row without a direction is left as it is (its alpha is still logged)
    h_q = (h[1] + 0.5 * rng.standard_normal(H)).astype(np.float32)
    st = ext.State(H)
    st.set_steer(dirs, h_q, 0.7, mode)
    out = run_callback(ggml, st, h)
    want, alpha = reference(h, dirs, h_q, 0.7, mode == GATED)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[2], h[2])
    np.testing.assert_allclose(st.alphas(), alpha, rtol=1e-5, atol=1e-6)
    assert st.error() is None


def test_one_direction_still_steers_every_row(ggml):
    rng = np.random.default_rng(4)
    h = rng.standard_normal((3, 16)).astype(np.float32)
    d = rng.standard_normal(16).astype(np.float32)
    h_q = rng.standard_normal(16).astype(np.float32)
    st = ext.State(16)
    st.set_steer(d, h_q, 1.5, GATED)
    out = run_callback(ggml, st, h)
    want, _ = reference(h, np.tile(d, (3, 1)), h_q, 1.5, True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_row_count_other_than_the_directions_is_an_error_and_changes_nothing(ggml):
    rng = np.random.default_rng(5)
    h = rng.standard_normal((4, 8)).astype(np.float32)
    st = ext.State(8)
    st.set_steer(rng.standard_normal((3, 8)).astype(np.float32), h[0], 1.0, UNGATED)
    out = run_callback(ggml, st, h)
    np.testing.assert_array_equal(out, h)
    assert "3 row directions" in st.error() and "4 rows" in st.error()


def test_a_direction_of_the_wrong_width_is_refused():
    st = ext.State(8)
    with pytest.raises(ValueError, match="rows, n_embd"):
        st.set_steer(np.ones((2, 7), np.float32), None, 1.0, UNGATED)
    with pytest.raises(ValueError, match="rows, n_embd"):
        st.set_steer(np.ones((0, 8), np.float32), None, 1.0, UNGATED)
