"""runtime.key_twin's re-encoding (the fast keys' twin, bench/q8_twin.py's too) is lossless: a Q5_0 block and the Q8_0 block it becomes
dequantise to the same weights (gguf-py's own dequantisers as the reference), every bit pattern
of the 5-bit integers included."""
from __future__ import annotations

import numpy as np
import pytest

gguf_quants = pytest.importorskip("gguf.quants")


def _random_q5_0_blocks(rng, n: int) -> np.ndarray:
    d = rng.standard_normal(n).astype(np.float16)
    d[:4] = [0.0, -0.0, np.float16(65504), np.float16(-1e-7)]  # zero, signed zero, largest, subnormal scales
    qh = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    qh[:2] = [0, 0xFFFFFFFF]
    qs = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    qs[0], qs[1] = 0, 255  # together with qh: every integer -16 and every integer 15
    return np.concatenate([d.view(np.uint8).reshape(n, 2), qh.view(np.uint8).reshape(n, 4), qs], axis=1)


def test_q5_0_blocks_become_q8_0_blocks_with_the_same_weights():
    from miita_edge.runtime import key_twin as twin

    rng = np.random.default_rng(7)
    blocks = _random_q5_0_blocks(rng, 4096)
    Q = gguf_quants.GGMLQuantizationType
    w5 = gguf_quants.dequantize(blocks.reshape(-1), Q.Q5_0)
    q8 = twin.q5_0_as_q8_0(blocks.reshape(-1))
    assert q8.size == 4096 * 34
    w8 = gguf_quants.dequantize(q8, Q.Q8_0)
    assert w5.shape == w8.shape == (4096 * 32,)
    np.testing.assert_array_equal(w5.view(np.uint32), w8.view(np.uint32))  # bitwise, signs of zeros too
    ints = q8.reshape(-1, 34)[:, 2:].view(np.int8)
    assert ints.min() == -16 and ints.max() == 15
    np.testing.assert_array_equal(q8.reshape(-1, 34)[:, :2], blocks[:, :2])  # the scale, byte for byte


def test_a_wrong_bit_order_would_be_caught():
    """The check above can fail: the high bits in the wrong order give other weights."""
    from miita_edge.runtime import key_twin as twin

    blocks = _random_q5_0_blocks(np.random.default_rng(8), 64)
    q8 = twin.q5_0_as_q8_0(blocks.reshape(-1)).reshape(-1, 34).copy()
    q8[:, 2:] = q8[:, 2:][:, ::-1]
    Q = gguf_quants.GGMLQuantizationType
    assert not np.array_equal(gguf_quants.dequantize(blocks.reshape(-1), Q.Q5_0),
                              gguf_quants.dequantize(q8.reshape(-1), Q.Q8_0))
