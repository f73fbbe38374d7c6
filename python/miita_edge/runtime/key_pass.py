"""Key-only passes on an engine's context: eq. 1's key values of prompts, without logits.

Three ways, all leaving the context reset:

- :func:`prompt_key`: one prompt per decode, the graph stopped after the deepest key layer
  (``EngineConfig.keys_stop_early``), continuing the rows it shares with the previous prompt where
  ``runtime.key_prefix`` shows the key stays bitwise a whole pass's (checked once per loaded model
  by :func:`probe_key_prefix`);
- :func:`prompt_keys`: several prompts as separate sequences in shared ``llama_decode`` calls,
  keys equal to one prompt per decode within rounding;
- on a model cut after its deepest key layer (``EngineConfig.key_cut``), each prompt's last
  selected row is marked as an output, the only row the cut layer keeps.

The engine owns the llama.cpp handles and the callback's state these passes drive; the passes'
own state (the previous prompt's rows, ``Engine._key_prefix``, and the per-model verdict of the
probe) lives on it because any other decode must clear it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelError
from .engine import Engine
from .key_prefix import KeyPrefix, mark_rows, tiled


__all__ = ["continued_pass", "key_prefix_ok", "probe_key_prefix", "prompt_key", "prompt_keys", "whole_pass"]


def prompt_keys(eng: Engine, prompts: Sequence[Sequence[int]], masks: Sequence[Sequence[bool]]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Eq. 1's key values of several prompts: ``[(pooled key-layer rows, per-layer divisors), ...]``
    as ``key_sum`` gives them for one.

    Prompts are decoded as separate sequences in shared ``llama_decode`` calls (up to
    ``n_seq_max`` prompts and ``n_batch`` tokens each), with no output rows: a 30-token prompt
    alone leaves the CPU waiting on weight reads, several at once use them ``n`` times per
    read. The callback sums each sequence's rows separately. Each sequence attends
    only to itself (llama.cpp's mask), so a key equals the one-prompt decode up to rounding
    (which rows take the repacked matmuls' one-row path, flash attention's tiled path from 64
    rows: docs/benchmarks.md); tested: cosine > 0.9999 for a mean of
    rows, > 0.999 for a last row. A prompt longer than
    ``n_batch`` is decoded alone, as ``decode`` does. Leaves the sequence reset."""
    if len(prompts) != len(masks):
        raise ValueError("one mask per prompt")
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(prompts)
    nb = eng.config.n_batch
    group: list[int] = []
    for i, toks in enumerate(prompts):
        if len(toks) != len(masks[i]) or not toks:
            raise ValueError("each prompt needs tokens and one mask flag per token")
        if len(toks) > nb:  # alone, in chunks
            out[i] = prompt_key(eng, toks, masks[i])
            continue
        if group and (len(group) >= max(1, min(eng.config.n_seq_max, eng._n_seq_ctx))
                      or sum(len(prompts[j]) for j in group) + len(toks) > nb):
            decode_group(eng, group, prompts, masks, out)
            group = []
        group.append(i)
    if group:
        decode_group(eng, group, prompts, masks, out)
    eng.reset()
    return out  # type: ignore[return-value]

def decode_group(eng: Engine, group, prompts, masks, out) -> None:
    b = eng._batch
    eng.reset()
    ids = np.empty(sum(len(prompts[j]) for j in group), np.int32)
    r = 0
    for s, j in enumerate(group):
        for pos, (t, m) in enumerate(zip(prompts[j], masks[j])):
            b.token[r], b.pos[r], b.n_seq_id[r], b.logits[r] = int(t), pos, 1, 0
            b.seq_id[r][0] = s
            ids[r] = s if m else -1
            r += 1
    b.n_tokens = r
    if eng.keys_on_output_rows:  # each prompt's last selected row is its output: the cut layer keeps it
        last = {int(g): i for i, g in enumerate(ids) if g >= 0}
        out_rows = sorted(last.values())
        for i in out_rows:
            b.logits[i] = 1
        eng.native.set_output_rows(np.asarray(out_rows, np.int64))
    eng.native.set_key_tensors(eng._key_names)
    eng.native.begin_groups(ids, len(group))
    if eng.config.keys_stop_early:
        eng.native.set_stop_after_keys(True)
    try:
        eng.decode_batch()
        sums, _ = eng.native.group_keys()
        rows = eng.native.group_key_rows()
    finally:
        eng.native.set_stop_after_keys(False)
        eng.native.end_groups()
        if eng.keys_on_output_rows:
            eng.native.set_output_rows(np.zeros(0, np.int64))
    for s, j in enumerate(group):
        out[j] = (sums[s].reshape(-1), rows[s].copy())

def prompt_key(eng: Engine, tokens: Sequence[int], mask: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 1's key values of one prompt, as ``key_sum`` gives them, from a
    key-only pass: no logits, and (``EngineConfig.keys_stop_early``) the graph stops after the
    deepest key layer, so the layers above it (5 of Gemma-3-270M's 18) are not computed.
    The rows summed are computed exactly as in a full pass. Leaves the sequence reset.

    With ``EngineConfig.key_prefix_cache`` the pass continues from the rows it shares with the
    previous key-only pass's prompt where ``runtime.key_prefix`` shows the key stays bitwise
    (a templated stream's instruction is decoded once, not once per example); those rows stay
    in the KV cache, invisible to callers: the next decode of any other kind clears them."""
    if prefix_usable(eng, len(tokens)):
        return continued_pass(eng, list(tokens), [bool(m) for m in mask])
    return whole_pass(eng, tokens, mask)

def prefix_usable(eng: Engine, n: int) -> bool:
    return (eng.config.key_prefix_cache and eng.config.keys_stop_early and not eng.config.clear_kv_data
            and not eng.keys_on_output_rows
            and eng.config.n_seq_max == 1 and 0 < n <= eng.config.n_batch
            and (eng._owner or eng)._key_prefix_verdict is not False)

def key_prefix_ok(eng: Engine) -> bool:
    """Whether this build's kernels keep keys bitwise when a pass continues another's rows
    (``runtime.key_prefix``'s rules), checked once per loaded model by ``_probe_key_prefix``."""
    owner = eng._owner or eng  # one verdict per loaded model; each context probes itself
    if owner._key_prefix_verdict is None:
        owner._key_prefix_verdict = probe_key_prefix(eng)
    return owner._key_prefix_verdict

def set_key_prefix_ok(eng: Engine, ok: bool | None) -> bool | None:
    """Set the loaded model's verdict on continued passes instead of probing (False: whole passes,
    what a failed probe gives; None: probe again when a row is next shared); returns the verdict
    it replaces, so a caller can put it back."""
    owner = eng.owner or eng
    before, owner._key_prefix_verdict = owner._key_prefix_verdict, ok
    return before

def probe_key_prefix(eng: Engine) -> bool:
    """Decode a few prompts that share prefixes (short ones, and ones past flash attention's
    64-row tile) both whole and continued, and compare the keys bit for bit. The rules in
    ``runtime.key_prefix`` were measured on one build; a CPU or build whose kernels round
    otherwise gets whole passes instead of keys that drift from ``ask``'s."""
    text = ("The quick brown fox jumps over the lazy dog while seven wizards quietly judge "
            "boxing matches at dawn; meanwhile the harbour lights flicker and a tired sailor "
            "counts the waves, numbering each one until the morning bell rings twice. ")
    base = eng.tokenize(text * 3, add_bos=True)
    alt = eng.tokenize(text[::-1] * 3, add_bos=False)
    if len(base) < 120 or len(alt) < 80:
        return False
    # cuts under the rules: -, 16, 20 (a rest of >= 8 rows), - (another attention path), 68,
    # 36 (a tiled rest of >= 64 rows), - ; rules any looser put some cut where rows round otherwise
    chain = [base[:30], base[:18] + alt[:12], base[:18] + alt[:10] + alt[40:42],
             base[:100], base[:70] + alt[:70], base[:70] + alt[:30], base[:20] + alt[:12]]
    eng._key_prefix = None
    try:
        continued = [continued_pass(eng, list(t), eng.key_mask(t, True), probing=True) for t in chain]
        eng.reset()
        for toks, (s, n) in zip(chain, continued):
            ws, wn = whole_pass(eng, toks, eng.key_mask(toks, True))
            if not (np.array_equal(ws, s) and np.array_equal(wn, n)):
                return False
        return True
    except ModelError:
        return False
    finally:
        eng.reset()

def whole_pass(eng: Engine, tokens, mask) -> tuple[np.ndarray, np.ndarray]:
    """A key-only pass over every row of the prompt."""
    eng.reset()
    stop = eng.config.keys_stop_early
    if stop:
        eng.native.set_stop_after_keys(True)
    try:
        if eng.keys_on_output_rows:  # the last selected row is the output the cut layer keeps
            sel = [i for i, m in enumerate(mask) if m]
            flags = [i == sel[-1] for i in range(len(tokens))] if sel else "none"
            eng.decode(tokens, flags, key_mask=mask, read_logits=False)
        else:
            eng.decode(tokens, "none", key_mask=mask)
        return eng.key_sum()
    finally:
        if stop:
            eng.native.set_stop_after_keys(False)
        eng._forget_positions()

def continued_pass(eng: Engine, tokens: list[int], mask: list[bool],
                          probing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``prompt_key`` from the deepest row it may share with the cached prefix (0: all rows).
    The first time a row would be shared, the build is probed (``key_prefix_ok``): a stream
    whose prompts share nothing never pays for the probe."""
    n = len(tokens)
    names = tuple(eng._key_names)
    kp = eng._key_prefix
    q = kp.cut_for(tokens, mask, names) if kp is not None else 0
    if q and not probing:
        probed = (eng._owner or eng)._key_prefix_verdict is not None
        if not key_prefix_ok(eng) or not probed:  # a probe leaves the KV cache empty: start anew
            q = 0
    st = eng.native
    if q:
        sums, pooled, rows = kp.states[q]
        eng._L.llama_memory_seq_rm(eng._mem, 0, q, -1)  # the shared rows stay
        eng._reset_callback()
        st.set_key_tensors(list(names))
        st.key_set(sums, pooled, rows)
        states = {r: v for r, v in kp.states.items() if r <= q}
        eng.key_rows_reused += q
    else:
        eng.reset()
        states = {}
    eng._key_prefix = None
    eng.n_past = q
    marks = mark_rows(q, n)
    st.set_stop_after_keys(True)
    try:
        eng.decode(tokens[q:], "none", key_mask=mask[q:], key_marks=[r - q for r in marks])
        m_sums, m_pooled, m_rows = st.key_marks()
        out = eng.key_sum()
    except BaseException:
        eng._forget_positions()
        raise
    finally:
        st.set_stop_after_keys(False)
        st.set_key_marks(np.zeros(0, np.int64))
    for i, r in enumerate(marks):
        states[r] = (m_sums[i], m_pooled[i], int(m_rows[i]))  # rows of arrays made for this pass
    eng._key_prefix = KeyPrefix(tokens, mask, names, tiled(n), states)
    eng.n_past = 0  # logically reset: the next decode of any other kind clears these rows
    return out
