"""How a key layer's rows become its block of eq. 1's key, and the division that finishes it.

The native callback hands back, per key layer, either the sum of the rows the key mask selects
(mean pooling) or the last of them (last-row pooling), with what each stands for; this module is
the pure arithmetic on top, shared by the engine, extraction and the model self-test.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KEY_POOLINGS", "key_mean"]

#: How a key layer's rows become its block of the key: "mean" averages every row the key mask
#: selects (eq. 1 as written), "last" keeps only the last selected row (the template's answer cue).
KEY_POOLINGS = ("mean", "last")


def key_mean(sums: np.ndarray, rows) -> np.ndarray:
    """Eq. 1's pooled key from the callback's per-layer values: each layer's H-block divided by
    what it stands for (``rows``: one int for every block, or one per block; 0 counts as 1). The
    division is float32 by a float32 count, bitwise the ``sums / n`` of a single shared count."""
    sums = np.asarray(sums)
    r = np.maximum(np.asarray(rows, np.int64).reshape(-1), 1).astype(np.float32)
    if r.size == 1:
        return sums / r[0]
    return (sums.reshape(r.size, -1) / r[:, None]).reshape(sums.shape)
