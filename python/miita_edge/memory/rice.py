"""Rice codes of ascending integer sets: the one bit-level code the stored form uses for lists of
places (which key coordinates a narrowed key keeps, which token ids the answers use).

Why Rice: a sorted set is told by the gaps between its members, and gaps of a set spread over a
range are roughly geometric, for which a Rice code with the best parameter k is within a few
percent of the entropy, needs no table, and is decoded in one pass. A gap g is written as
``g >> k`` one-bits, a zero bit, then g's k low bits, least significant first; a stream is bits
in order, packed least significant bit first (``np.packbits(..., bitorder="little")``).
Pure functions, no I/O.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_K", "best_k", "gaps_of", "read_gaps", "rice_bits", "write_gaps"]

#: Parameters tried, 0..MAX_K-1 (gaps up to 2^24 and beyond code in a few dozen bits at most).
MAX_K = 24


def gaps_of(places: np.ndarray) -> np.ndarray:
    """Each member's gap to the previous one minus one (the first's to -1): ascending places
    0, 1, 5 give 0, 0, 3."""
    places = np.asarray(places, np.int64)
    return np.diff(np.concatenate([[-1], places])) - 1


def rice_bits(gaps: np.ndarray, k: int) -> int:
    """Bits of the gaps coded with parameter k."""
    gaps = np.asarray(gaps, np.int64)
    return int(np.sum(gaps >> k)) + len(gaps) * (1 + k)


def best_k(gaps: np.ndarray) -> tuple[int, int]:
    """(k, bits): the first parameter of the fewest bits."""
    sizes = [rice_bits(gaps, k) for k in range(MAX_K)]
    k = int(np.argmin(sizes))
    return k, sizes[k]


def write_gaps(gaps: np.ndarray, k: int) -> np.ndarray:
    """The bits (uint8, one 0/1 per bit) of the gaps coded with parameter k."""
    out: list[int] = []
    for g in np.asarray(gaps, np.int64).tolist():
        if g < 0:
            raise ValueError(f"a Rice code holds gaps >= 0, got {g}")
        out.extend([1] * (g >> k))
        out.append(0)
        out.extend((g >> i) & 1 for i in range(k))
    return np.array(out, np.uint8)


def read_gaps(bits: np.ndarray, n: int, k: int, what: str) -> tuple[np.ndarray, int]:
    """(the first n gaps coded in ``bits`` with parameter k, the bit after the last), int64.
    ValueError ("``what`` is shorter than ...") where the bits end before n gaps do."""
    zeros = np.flatnonzero(np.asarray(bits) == 0)
    weights = np.int64(1) << np.arange(k, dtype=np.int64)
    gaps, at = np.empty(n, np.int64), 0
    for i in range(n):
        z = np.searchsorted(zeros, at)  # the run of one-bits ends at the next zero at or after ``at``
        if z == len(zeros) or zeros[z] + 1 + k > len(bits):
            raise ValueError(f"{what} is shorter than the places it must list")
        stop = int(zeros[z])
        gaps[i] = ((stop - at) << k) + int(bits[stop + 1:stop + 1 + k].astype(np.int64) @ weights)
        at = stop + 1 + k
    return gaps, at
