"""Row kernels over a model's LM head, read in place from the mapped GGUF (quantized rows are
dequantized inside the kernels): the rows themselves, weighted sums, eqs. 6-7 and eq. 2."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..native import ext
from .gguf_model import ModelInfo

__all__ = ["LMHeadRows"]


class LMHeadRows:
    """Row kernels over the LM head mapped from the GGUF (quantized, read in place)."""

    def __init__(self, info: ModelInfo, n_threads: int = 0):
        self.info = info
        self.head = info.lm_head
        self.W = info.map_lm_head()
        self.n_threads = n_threads

    def _args(self):
        h = self.head
        return (self.W, h.ggml_type, h.n_vocab, h.n_embd, h.row_bytes)

    def rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """W[ids] as float32 (n, H)."""
        return ext.lm_gather(*self._args(), np.asarray(ids, np.int32), self.n_threads)

    def weighted_sum(self, ids, weights) -> np.ndarray:
        """Σ_i w_i W[ids_i] (eq. 7's W_Vᵀ g)."""
        return ext.lm_weighted_sum(*self._args(), np.asarray(ids, np.int32),
                                       np.asarray(weights, np.float32), self.n_threads)

    def restricted_uncertainty(self, logits: np.ndarray, K: int):
        """Eqs. 6-7 in one native call: (ids, p_hat, g, H_hat, r_q), as ``retrieval._restricted``
        computes them from ``top_k_restricted``, ``restricted_entropy_grad`` and W_Vᵀg (float64;
        tested against those). ValueError for NaN/+inf or all -inf logits."""
        z = np.ascontiguousarray(logits, np.float32)
        try:
            ids, p, g, H, r = ext.restricted_uncertainty(*self._args(), z, int(min(max(K, 1), z.shape[0])))
        except RuntimeError as e:
            raise ValueError(f"top_k_restricted: {e}") from e
        return ids.astype(np.int64), p, g, float(H), r

    def correction_from_hidden(self, hidden: np.ndarray, targets: Sequence[int],
                               per_position: bool = False) -> np.ndarray:
        """Exact eq. 2 with p_t = softmax(W h_t), from the final hidden rows, in one pass over W."""
        c = self.info.logit_mult  # logits = c W h (granite: c = 1 / logit_scale)
        if c != 1.0:
            hidden = np.asarray(hidden, np.float32) * np.float32(c)
        return ext.lm_correction_hidden(*self._args(), np.ascontiguousarray(hidden, np.float32),
                                            np.asarray(targets, np.int32), bool(per_position), self.n_threads)

    def correction(self, logits: np.ndarray, targets: Sequence[int], top_k: int = 0,
                   per_position: bool = False) -> np.ndarray:
        """R = mean_t (W[y_t] − Σ_v p_t(v) W[v]) (eq. 2), or one R_t per position."""
        return ext.lm_correction(*self._args(), np.ascontiguousarray(logits, np.float32),
                                     np.asarray(targets, np.int32), int(top_k), bool(per_position),
                                     self.n_threads)
