"""Where a key-only pass may start from the KV cache of the previous prompt, keeping keys bitwise.

Templated streams share a prompt prefix (an instruction, a QA context, a SuperNI task definition):
ingest decodes the same leading rows again for every example. Reusing them is only worth having if
the key stays bitwise the one a whole pass gives (the exact-repeat rule and ``forget`` compare
stored keys array for array), and llama.cpp's CPU kernels make a row's value depend on more than
its tokens. Measured on the vendored llama.cpp (llama-cpp-python 0.3.36, x86 AVX-512 build;
``tests/test_key_prefix.py``, bench/key_prefix_rules.py), a row of a pass over rows
[q, n) equals the same row of a whole n-row pass when:

* the cut is a multiple of 4 (``ROW_ALIGN``): the repacked Q4_K product runs a ubatch's rows in
  4-row gemm blocks and its last ``rows % 4`` through gemv, which round differently;
* every ubatch has at least 8 rows (``MIN_ROWS``): smaller ones take other kernels (a 4-row
  prefix or a 1..7-row rest never matched);
* both passes use the same flash-attention algorithm, which ggml-cpu picks per ubatch: the tiled
  one from 64 query rows (``FA_TILE_ROWS``, ``GGML_FA_TILE_Q``), the per-row one below. A prompt
  of n >= 64 rows may therefore only continue rows computed by another >= 64-row pass, and its rest
  must keep >= 64 rows.

These are facts of one build, not of ggml's contract, so the engine checks them once per loaded
model before trusting them (``runtime.key_pass.key_prefix_ok``) and falls back to whole passes if a probe
differs. The key accumulators themselves are continued from a snapshot taken at the cut
(``miita_state_set_key_marks``), so the double-precision sums add the same rows in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

ROW_ALIGN = 4
MIN_ROWS = 8
FA_TILE_ROWS = 64


def tiled(n: int) -> bool:
    """Whether a one-ubatch pass of ``n`` rows takes flash attention's tiled path."""
    return n >= FA_TILE_ROWS


def mark_rows(start: int, n: int) -> list[int]:
    """The rows of a pass over rows [start, n) of an n-row prompt before which the key state is
    kept for a later prompt to continue from: multiples of ``ROW_ALIGN``, at least ``MIN_ROWS``,
    after ``start`` and before ``n``."""
    first = max(start + 1, MIN_ROWS)
    first += (-first) % ROW_ALIGN
    return list(range(first, n, ROW_ALIGN))


def cut(n: int, common: int, marks: Iterable[int], cached_tiled: bool) -> int:
    """The deepest kept row q (0: none) from which an n-row prompt that shares its first ``common``
    (token, mask) pairs with the cached prompt can be decoded as rows [q, n) with its key bitwise
    that of a whole pass. ``cached_tiled``: the attention path the cached rows were computed on."""
    if tiled(n) != cached_tiled:
        return 0
    rest = FA_TILE_ROWS if tiled(n) else MIN_ROWS
    best = 0
    for q in marks:
        if q <= common and n - q >= rest and q > best:
            best = q
    return best


def common_prefix(a_tokens: Sequence[int], a_mask: Sequence[bool], b_tokens: Sequence[int],
                  b_mask: Sequence[bool]) -> int:
    """How many leading (token, key-mask flag) pairs two prompts share."""
    n = min(len(a_tokens), len(b_tokens))
    i = 0
    while i < n and a_tokens[i] == b_tokens[i] and bool(a_mask[i]) == bool(b_mask[i]):
        i += 1
    return i


@dataclass
class KeyPrefix:
    """What the KV cache holds after a key-only pass: its prompt, the key tensors it was pooled
    from, the attention path its rows took, and the key state before each kept row."""

    tokens: list[int]
    mask: list[bool]
    names: tuple[str, ...]
    tiled: bool
    # row -> (key sums (L·H,) float64, pooled counts (L,), key rows) before that row
    states: dict[int, tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)

    def cut_for(self, tokens: Sequence[int], mask: Sequence[bool], names: Sequence[str]) -> int:
        if tuple(names) != self.names:
            return 0
        common = common_prefix(self.tokens, self.mask, tokens, mask)
        return cut(len(tokens), common, self.states.keys(), self.tiled)
