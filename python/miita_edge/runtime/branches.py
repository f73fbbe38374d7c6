"""Several short continuations of the held prompt decoded together (``decode_branches``).

The answer reading (method/answer_reading) scores a query's four leading labels after its prompt:
each label's rows through a 262,144-word LM head. One ``llama_decode`` per label pays the call's
fixed costs four times; here the labels go into one decode as sequences 1..k beside the prompt's
sequence 0, each sharing the prompt's KV cells (``llama_memory_seq_cp``), and a token that several
labels begin with ("card" of "card arrival" and "card linking") is one batch row that belongs to
all of them (``prefix_tree``), so its row through the head is computed once. llama.cpp's mask lets
a row attend to the cells of its first sequence id: the prompt's and its own path's, never a
sibling's (a node's ancestors belong to every branch through it). Afterwards the branch sequences
are removed, so the cache holds the prompt as before.

A row can differ from a one-branch decode in the last bits (llama.cpp rounds a larger batch
differently; tests/test_branches.py bounds it); a one-sequence context (``n_branches=0``) decodes
the branches one after another, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ContextOverflow, ModelError
from .engine import Engine

__all__ = ["PrefixTree", "decode_branches", "prefix_tree"]


@dataclass(frozen=True)
class PrefixTree:
    """The distinct prefixes of some token sequences, one node each, parents before children.

    ``tokens[i]``/``depth[i]``: node i's last token and its 0-based position in the sequence;
    ``members[i]``: the sequences (indices) that begin with node i's prefix, increasing;
    ``paths[b]``: sequence b's node per token."""
    tokens: list[int]
    depth: list[int]
    members: list[list[int]]
    paths: list[list[int]]


def prefix_tree(seqs: Sequence[Sequence[int]]) -> PrefixTree:
    """The prefix tree of ``seqs``: a node per distinct non-empty prefix (an empty sequence has no
    nodes)."""
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    members: list[list[int]] = []
    paths: list[list[int]] = []
    for b, seq in enumerate(seqs):
        path = []
        for d in range(len(seq)):
            key = tuple(int(t) for t in seq[: d + 1])
            i = index.get(key)
            if i is None:
                i = index[key] = len(tokens)
                tokens.append(int(seq[d]))
                depth.append(d)
                members.append([])
            members[i].append(b)
            path.append(i)
        paths.append(path)
    return PrefixTree(tokens, depth, members, paths)


def decode_branches(eng: Engine, branches: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Each branch's logits rows (len(branch), V), copied, as if it alone were appended to the
    positions ``eng`` holds; the cache is left holding what it held (``Engine.holds`` keeps its
    answer). Together where the context has branch sequences (``EngineConfig.n_branches``), else one
    after another (see the module's docstring)."""
    if eng._key_prefix is not None:  # a key-only pass's rows, kept for the next one: not ours
        eng._forget_positions()
    if eng.config.key_cut:
        raise ModelError(f"{eng.info.path.name} is cut after its key layers: it computes keys only")
    seqs = [[int(t) for t in br] for br in branches]
    out = [np.zeros((0, eng.n_vocab), np.float32) for _ in seqs]
    n, n_ctx = eng.n_past, eng.config.n_ctx
    if any(n + len(s) > n_ctx for s in seqs):
        raise ContextOverflow(f"a branch of {max(len(s) for s in seqs)} tokens after {n} exceeds the context "
                              f"of {n_ctx}")
    slots, nb = eng._n_seq_ctx - 1, eng.config.n_batch
    todo = [i for i, s in enumerate(seqs) if s]
    kept = (eng._prompt, min(eng._intact, n))
    while todo:
        group: list[int] = []
        for i in todo:
            cand = group + [i]
            rows = len(prefix_tree([seqs[j] for j in cand]).tokens)
            if len(cand) <= slots and rows <= nb and n + rows <= n_ctx:
                group = cand
        if not group:  # no branch sequences, or a branch longer than a batch: alone, then cut off
            i = todo.pop(0)
            out[i] = eng.decode(seqs[i], logits="all")
            eng.truncate(n)
            continue
        for i, rows in zip(group, _decode_group(eng, [seqs[i] for i in group], n)):
            out[i] = rows
        todo = [i for i in todo if i not in group]
    eng._prompt, eng._intact = kept
    return out


def _batch(eng: Engine):
    """The engine's batch for branch decodes: a row may belong to every branch sequence."""
    if eng._branch_batch is None:
        eng._branch_batch = eng._L.llama_batch_init(eng.config.n_batch, 0, max(1, eng._n_seq_ctx - 1))
    return eng._branch_batch


def _decode_group(eng: Engine, seqs: list[list[int]], n: int) -> list[np.ndarray]:
    """One llama_decode of ``seqs`` as sequences 1..len(seqs) after the held ``n`` rows."""
    L, mem, b = eng._L, eng._mem, _batch(eng)
    tree = prefix_tree(seqs)
    for s in range(1, len(seqs) + 1):
        L.llama_memory_seq_cp(mem, 0, s, 0, n)
    for r, (tok, d, who) in enumerate(zip(tree.tokens, tree.depth, tree.members)):
        b.token[r], b.pos[r], b.n_seq_id[r], b.logits[r] = tok, n + d, len(who), 1
        for k, m in enumerate(who):
            b.seq_id[r][k] = m + 1
    b.n_tokens = len(tree.tokens)
    eng.native.set_key_tensors([])
    try:
        if eng.keys_on_output_rows:
            eng.native.set_output_rows(np.arange(len(tree.tokens), dtype=np.int64))
        eng._prompt = None
        rc = L.llama_decode(eng._ctx, b)
        if rc != 0:
            raise ModelError(f"llama_decode failed with code {rc}")
        err = eng.native.error()
        if err:
            raise ModelError(f"native callback: {err}")
        rows = np.empty((len(tree.tokens), eng.n_vocab), np.float32)
        for r in range(len(tree.tokens)):
            rows[r] = np.ctypeslib.as_array(L.llama_get_logits_ith(eng._ctx, r), shape=(eng.n_vocab,))
        return [rows[path] for path in tree.paths]
    finally:
        for s in range(1, len(seqs) + 1):
            L.llama_memory_seq_rm(mem, s, -1, -1)
