"""The query side of a bank: the matrices retrieval reads and the preparation of a query key.

:class:`QueryView` is mixed into ``MemoryBank``: each view reads the stored arrays in place while
the bank is as opened (``StoredArrays``: answering needs no Prototype objects), else walks its
prototypes. ``prepare_key`` and ``prepare_query`` turn a raw pooled key into the vector that is
compared and stored.
"""
from __future__ import annotations

import numpy as np

from ..native import ext
from . import codecs
from .bank_arrays import StoredArrays
from .prototype import BankConfig, Prototype

__all__ = ["QueryView"]


class QueryView:
    """What a bank shows retrieval (``MemoryBank`` holds the state these read)."""

    config: BankConfig
    n_embd: int
    key_parts: int
    key_mean: np.ndarray | None
    key_order: np.ndarray | None
    key_whiten: np.ndarray | None
    key_narrow: np.ndarray | None
    key_dim: int
    narrowed: bool
    _protos: list[Prototype] | None
    _stored: StoredArrays | None
    protos: list[Prototype]

    @property
    def n_prototypes(self) -> int:
        return self._stored.J if self._protos is None else len(self._protos)

    @property
    def n_anchors(self) -> int:
        return len(self._stored.owner) if self._protos is None else sum(len(p.anchors) for p in self._protos)

    def anchor_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """All anchors (A, H) float32 and their owner prototype index (A,)."""
        if self._protos is None:
            return self._stored.anchors(), self._stored.owner_sorted()
        if not self.protos:
            return np.zeros((0, self.key_dim), np.float32), np.zeros(0, np.int64)
        A = np.concatenate([p.anchors for p in self.protos])
        owner = np.concatenate([np.full(len(p.anchors), j) for j, p in enumerate(self.protos)])
        return A, owner

    def anchor_owner(self) -> np.ndarray:
        """The owner prototype of each row of ``anchor_matrix()`` (A,) int64, without the matrix."""
        if self._protos is None:
            return self._stored.owner_sorted()
        if not self._protos:
            return np.zeros(0, np.int64)
        return np.concatenate([np.full(len(p.anchors), j) for j, p in enumerate(self._protos)])

    def packed_anchors(self) -> np.ndarray:
        """The rows of ``anchor_matrix()`` as packed sign bits (A, ceil(H/8)) uint8: for 1-bit keys
        exactly the stored bytes (read in place when the bank was just opened)."""
        if self._protos is None:
            if self.config.key_precision == "bit":
                return self._stored.packed_sorted()
            return np.packbits(self._stored.anchors() >= 0, axis=1)
        if not self.protos:
            return np.zeros((0, (self.key_dim + 7) // 8), np.uint8)
        return np.concatenate([np.packbits(p.anchors >= 0, axis=1) for p in self.protos])

    def counts(self) -> np.ndarray:
        """Each prototype's n, the examples written into it (J,) int64."""
        if self._protos is None:
            return self._stored.counts.astype(np.int64)
        return np.array([p.n for p in self._protos], np.int64)

    def radii(self) -> np.ndarray:
        """Each prototype's radius as a cosine (J,) float64 (1.0: no second example yet)."""
        if self._protos is None:
            return self._stored.radii()
        return np.array([p.radius for p in self._protos], np.float64)

    def anchor_counts(self) -> np.ndarray:
        """How many keys each row of ``anchor_matrix()`` stands for (A,) int64."""
        if self._protos is None:
            a = self._stored.acount
            return (a if self._stored.sorted else a[self._stored.by_owner]).astype(np.int64)
        if not self._protos:
            return np.zeros(0, np.int64)
        return np.concatenate([p.anchor_n for p in self._protos]).astype(np.int64)

    def max_token(self) -> int:
        """The largest stored answer token id (-1 without any): checked against the model's vocabulary."""
        if self._protos is None:
            flat = self._stored.seqs().flat
            return int(flat.max()) if len(flat) else -1
        return max((int(p.tokens.max()) for p in self._protos if len(p.tokens)), default=-1)

    def answer_tokens(self):
        """Each prototype's answer tokens (a sequence of int32 arrays, indexable by prototype)."""
        if self._protos is None:
            return self._stored.seqs()
        return [p.tokens for p in self._protos]

    def evidence(self) -> list:
        """Each prototype's evidence, its taught input's tokens (int32), or None (method/verify)."""
        if self._protos is None:
            return self._stored.evidence()
        return [p.evidence for p in self._protos]

    def directions(self, position: int = 0) -> np.ndarray:
        """(J, H) direction of each prototype at an answer position (zeros where absent)."""
        if self._protos is None:
            return self._stored.directions(position)
        D = np.zeros((len(self.protos), self.n_embd), np.float32)
        for j, p in enumerate(self.protos):
            if position < len(p.dirs):
                D[j] = p.dirs[position]
        return D

    def prepare_key(self, key: np.ndarray, whiten: np.ndarray | None = None) -> np.ndarray:
        """Raw mean-pooled key -> the vector that is compared and stored: centred, each layer's
        block at unit norm, whitened (``key_whiten``, where the preset asks; ``whiten`` in its
        place, for a reach measured out of sample), its coordinates in ``key_order``, the first
        ``key_dim`` kept, unit."""
        k = np.asarray(key, np.float32)
        if k.shape != (self.n_embd * self.key_parts,):
            raise ValueError(f"key has shape {k.shape}, expected ({self.n_embd * self.key_parts},)")
        if self.key_mean is not None:
            k = k - self.key_mean
        if self.key_parts > 1:
            blocks = k.reshape(self.key_parts, self.n_embd)
            k = (blocks / np.maximum(np.linalg.norm(blocks, axis=1, keepdims=True), 1e-12)).reshape(-1)
        frame, order = self._frame()
        return self._whiten_order_cut(k, frame if whiten is None else whiten, order)

    def _frame(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The matrix and the coordinate order keys are prepared with now: ``key_narrow`` (no order)
        once repair has narrowed keys into it, else ``key_whiten`` and ``key_order``."""
        return (self.key_narrow, None) if self.narrowed else (self.key_whiten, self.key_order)

    def _whiten_order_cut(self, k: np.ndarray, whiten: np.ndarray | None, order: np.ndarray | None) -> np.ndarray:
        if whiten is not None:
            # without an order after it, only the rows of the coordinates kept are needed
            k = (whiten if order is not None else whiten[:self.key_dim]) @ k
        if order is not None:
            k = k[order]
        k = k[:self.key_dim]
        n = np.linalg.norm(k)
        return k / n if n > 0 else k

    def prepare_query(self, key: np.ndarray, rows=None) -> np.ndarray:
        """``prepare_key`` for a query, as float32, in one native call: the same centring (float32,
        so the signs a 1-bit memory compares are those ``prepare_key`` gives), block norms, order
        and cut, with the norms taken in double (agrees with ``prepare_key`` to float32 rounding).
        ``rows``: ``key`` is the callback's sums (``QueryState.key_sum``) and ``rows`` each block's
        row count (``pooled_rows``; one count for all blocks, 0 as 1), divided as
        ``key_pooling.key_mean`` divides, bitwise.
        Retrieval calls it once per answer, right after a prompt pass, when each numpy step costs
        several microseconds of cold caches."""
        k = np.asarray(key, np.float32)
        if k.shape != (self.n_embd * self.key_parts,):
            raise ValueError(f"key has shape {k.shape}, expected ({self.n_embd * self.key_parts},)")
        frame, order = self._frame()
        if frame is None:
            return ext.prepare_query(k, self.key_parts, self.key_mean, order, self.key_dim, rows)
        # whitening mixes coordinates, so it comes before the order and the cut: the native call
        # centres and normalises the blocks (and the whole key, a scale the linear whitening and
        # the final norm drop), numpy does the rest as prepare_key does
        full = ext.prepare_query(k, self.key_parts, self.key_mean, None, self.n_embd * self.key_parts, rows)
        return self._whiten_order_cut(np.asarray(full, np.float32), frame, order).astype(np.float32)

    def store_key(self, key: np.ndarray) -> np.ndarray:
        """What a prepared key becomes on disk (decoded), shape (1, H)."""
        return codecs.roundtrip(key[None], self.config.key_precision)

    # ------------------------------------------------------------ similarity
