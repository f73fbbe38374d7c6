"""The answers' token dictionary as one Rice-coded list (``tok_ids``): each distinct token id the
stored answers use, ascending.

Why: under a tight budget every byte a memory does not spend on framing goes to its keys. A
dictionary row costs 2 bytes (3 from id 2^16) as an array; the ids of a few dozen labels spread
over a vocabulary of 2^18 have gaps of a few thousand, which a Rice code writes in about 13 bits
(Banking77's 105 distinct ids on Gemma: 237 bytes as rows, 184 as ``tok_ids``). The rows are still
written where they are smaller (few ids over a wide range) and still read.

Layout (``uint8``): byte 0 the Rice parameter k (below ``rice.MAX_K``), then the number of ids as
an unsigned LEB128 varint, then the ids' gaps (``rice.gaps_of``) coded with k, least significant
bit first, the last byte's unused bits zero. Pure functions, no I/O.
"""
from __future__ import annotations

import numpy as np

from .rice import MAX_K, best_k, gaps_of, read_gaps, write_gaps
from .store_format import varint

__all__ = ["decode_token_ids", "encode_token_ids", "token_ids_nbytes"]


def _check(ids) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    if ids.ndim != 1 or (len(ids) and (ids.min() < 0 or (np.diff(ids) <= 0).any())):
        raise ValueError("token ids must be distinct, ascending and >= 0")
    return ids


def token_ids_nbytes(ids) -> int:
    """Bytes of ``encode_token_ids(ids)``, without building it."""
    ids = _check(ids)
    return 1 + len(varint(len(ids))) + (best_k(gaps_of(ids))[1] + 7) // 8


def encode_token_ids(ids) -> np.ndarray:
    """``tok_ids`` for the distinct ascending token ids ``ids``."""
    ids = _check(ids)
    gaps = gaps_of(ids)
    k, _ = best_k(gaps)
    head = np.array([k, *varint(len(ids))], np.uint8)
    return np.concatenate([head, np.packbits(write_gaps(gaps, k), bitorder="little")])


def decode_token_ids(buf) -> np.ndarray:
    """Inverse of ``encode_token_ids`` (int32 ids). ValueError naming what does not hold for a
    stream it never writes."""
    b = np.asarray(buf)
    if b.ndim != 1 or b.dtype != np.uint8 or len(b) < 2:
        raise ValueError(f"tok_ids array has dtype {b.dtype} and shape {b.shape}, expected a byte stream")
    k = int(b[0])
    if k >= MAX_K:
        raise ValueError(f"tok_ids has a Rice parameter {k} it never writes")
    n, shift, at = 0, 0, 1
    while True:
        if at >= len(b) or shift > 28:
            raise ValueError("tok_ids does not say how many ids it holds")
        n |= (int(b[at]) & 0x7F) << shift
        shift += 7
        at += 1
        if not b[at - 1] & 0x80:
            break
    bits = np.unpackbits(b[at:], bitorder="little")
    gaps, end = read_gaps(bits, n, k, "tok_ids")
    if (end + 7) // 8 != len(b) - at or bits[end:].any():
        raise ValueError("tok_ids does not end where its ids do")
    ids = np.cumsum(gaps + 1) - 1
    if n and ids[-1] >= 1 << 24:
        raise ValueError("tok_ids holds an id past 2^24")
    return ids.astype(np.int32)
