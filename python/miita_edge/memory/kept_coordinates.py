"""Which coordinates of the key frame a narrowed key keeps, when they are not the frame's first ones:
their stored form (``key_kept``, a Rice-coded bit stream) and its reader.

Why stored: a repair that narrows by balance (``BankConfig.narrow_rule = "balanced"``) keeps the
coordinates in which this memory's answers differ, and which those are depends on what the memory
learned, so the set is bytes derived from the stream and counts against the budget. The frame's
order itself is derived from the model and is not stored; the set is a list of places in it.

Layout (``uint8``): byte 0 holds the Rice parameter k in its low 5 bits and, in bit 7, whether
the list is of the coordinates dropped (1) or kept (0), whichever codes shorter; then, least
significant bit first, each listed place's gap to the previous one (the first's to -1) minus one,
as q = gap >> k one-bits, a zero bit, and gap's k low bits; the last byte's unused bits are zero.
How many places are listed follows from the key width, so it is not stored. The code: ``rice.py``.
"""
from __future__ import annotations

import numpy as np

from .rice import MAX_K, best_k, gaps_of, read_gaps, write_gaps

__all__ = ["decode_kept", "encode_kept", "kept_nbytes", "order_with_kept"]

_COMPLEMENT = 0x80


def _listed(kept: np.ndarray, width: int) -> tuple[np.ndarray, bool, int, int]:
    """The places to list (kept or dropped, whichever codes shorter), whether they are the dropped
    ones, the Rice parameter and the bits, each choice the first of the shortest."""
    mask = np.zeros(width, bool)
    mask[kept] = True
    best = None
    for complement in (False, True):
        pos = np.flatnonzero(~mask if complement else mask)
        k, bits = best_k(gaps_of(pos))
        if best is None or bits < best[3]:
            best = (pos, complement, k, bits)
    return best


def _check(kept: np.ndarray, width: int) -> np.ndarray:
    kept = np.asarray(kept, np.int64)
    if kept.ndim != 1 or not len(kept) or kept.min() < 0 or kept.max() >= width or (np.diff(kept) <= 0).any():
        raise ValueError(f"kept coordinates must be ascending places in 0..{width - 1}")
    return kept


def encode_kept(kept, width: int) -> np.ndarray:
    """``key_kept`` for the ascending places ``kept`` of a frame ``width`` coordinates wide."""
    pos, complement, k, _ = _listed(_check(kept, width), width)
    head = np.array([k | (_COMPLEMENT if complement else 0)], np.uint8)
    return np.concatenate([head, np.packbits(write_gaps(gaps_of(pos), k), bitorder="little")])


def kept_nbytes(kept, width: int) -> int:
    """Bytes of ``encode_kept(kept, width)``, without building it."""
    return 1 + (_listed(_check(kept, width), width)[3] + 7) // 8


def decode_kept(buf, n_kept: int, width: int) -> np.ndarray:
    """Inverse of ``encode_kept`` for a key of ``n_kept`` coordinates out of ``width``: the kept
    places, ascending (int64). ValueError naming what does not hold for a stream it never writes."""
    b = np.asarray(buf)
    if b.ndim != 1 or b.dtype != np.uint8 or len(b) < 1:
        raise ValueError(f"key_kept array has dtype {b.dtype} and shape {b.shape}, expected a byte stream")
    if not 0 < n_kept <= width:
        raise ValueError(f"key_kept: a key of {n_kept} coordinates out of {width}")
    head = int(b[0])
    k, complement = head & 0x1F, bool(head & _COMPLEMENT)
    if head & 0x60 or k >= MAX_K:
        raise ValueError(f"key_kept has a header byte {head} it never writes")
    n = width - n_kept if complement else n_kept
    bits = np.unpackbits(b[1:], bitorder="little")
    gaps, at = read_gaps(bits, n, k, "key_kept")
    pos = np.cumsum(gaps + 1) - 1
    if n and pos[-1] >= width:
        raise ValueError(f"key_kept lists a place past the frame's {width} coordinates")
    if (at + 7) // 8 != len(b) - 1 or bits[at:].any():
        raise ValueError("key_kept does not end where its places do")
    if not complement:
        return pos
    mask = np.ones(width, bool)
    mask[pos] = False
    return np.flatnonzero(mask)


def order_with_kept(base: np.ndarray, kept: np.ndarray, shared=()) -> np.ndarray:
    """The coordinate order of a key that keeps the places ``kept`` (ascending) of the derived order
    ``base`` and shares the places ``shared``: those first, in their order, then the shared ones,
    then the rest, so that a key's first ``len(kept) + len(shared)`` coordinates are the ones it
    has, as every reader of ``key_order`` and ``key_dim`` assumes."""
    base = np.asarray(base, np.int64)
    shared = np.asarray(shared, np.int64)
    rest = np.ones(len(base), bool)
    rest[kept] = False
    rest[shared] = False
    return np.concatenate([base[kept], base[shared], base[rest]])
