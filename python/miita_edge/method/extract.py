"""Extraction (eqs. 1–2): one decode pass turns (x, y) into a key and corrections.

The prompt and the answer are decoded together in one batch; only the positions
that predict answer tokens are output rows, and the callback sums the key
layer's rows over the prompt only. Exact R (eq. 2) of a short answer is computed from those
rows' final hidden states in one online-softmax pass over the LM head, with
llama.cpp's own LM-head product skipped; longer answers and top-k R read
llama.cpp's logits (``HIDDEN_R_MAX_TOKENS``).
For the ``tokens`` payload no corrections are needed, so only the prompt is decoded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime import key_pass
from ..runtime.engine import Engine
from ..runtime.key_pooling import key_mean
from .templates import Template

#: Tokens kept from the END of a prompt that is cut to a token budget: the end of the input
#: and the template's answer cue (SuperNI's "Output:") must survive, or the model does not
#: know that an answer is due. See :func:`truncate_tokens`.
PROMPT_TAIL_TOKENS = 32

#: Answers of at most this many tokens get exact R from the hidden rows (one online-softmax pass
#: over the head, llama.cpp's LM-head product skipped); longer ones from llama.cpp's logits and
#: one pass with the position-averaged distribution. The one-pass kernel costs 2T row operations
#: (a dot and an axpy per position), the logits path T batched dots plus one axpy, so the first
#: wins on short answers only (the retired ``bench/extract.py``; docs/method.md, "Extraction" and
#: "Retired experiments").
HIDDEN_R_MAX_TOKENS = 4

#: Examples whose exact R share one online-softmax pass over the LM head during ingest
#: (:func:`finish_corrections`). The pass costs a fixed part (reading and dequantising the whole
#: head) plus a part per answer position; sharing it spreads the fixed part. Every position keeps its own softmax, so the result is bitwise the per-example one.
HIDDEN_BATCH_EXAMPLES = 8


def truncate_tokens(tokens: list[int], max_tokens: int | None, tail: int = PROMPT_TAIL_TOKENS) -> list[int]:
    """Cut a tokenized prompt to ``max_tokens``: the first ``max_tokens - tail`` tokens (BOS,
    instruction, start of the input) plus the last ``tail`` (end of the input, answer cue).

    ``None`` or a prompt that fits: returned unchanged. The middle of a long input is what is
    lost, which for SuperNI is the bulk of a long document, not the task definition.
    """
    if max_tokens is None or len(tokens) <= max_tokens:
        return list(tokens)
    if max_tokens <= tail:
        raise ValueError(f"max_prompt_tokens must be > {tail} (the kept tail), got {max_tokens}")
    return list(tokens[:max_tokens - tail]) + list(tokens[len(tokens) - tail:])


def prompt_tokens(engine: Engine, template: Template, x: str, max_tokens: int | None = None) -> list[int]:
    """``template``'s prompt for ``x``, tokenized (with BOS) and cut by :func:`truncate_tokens`."""
    return truncate_tokens(engine.tokenize(template.render_prompt(x)), max_tokens)


def prompt_and_target(engine: Engine, template: Template, x: str, y: str, *, skip_bos: bool,
                      max_prompt_tokens: int | None) -> tuple[list[int], list[int], list[bool]] | None:
    """(prompt tokens, answer tokens, key mask over the prompt) for one example; None when either
    side is empty. The mask leaves out the BOS row when ``skip_bos``."""
    prompt = prompt_tokens(engine, template, x, max_prompt_tokens)
    target = engine.tokenize(template.render_target(y), add_bos=False)
    if not target or not prompt:
        return None
    return prompt, target, engine.key_mask(prompt, skip_bos)


@dataclass
class PendingR:
    """An example decoded up to its final hidden rows, whose exact R waits for a head pass shared
    with other examples (:func:`finish_corrections`)."""
    prompt: list[int]
    target: list[int]
    key: np.ndarray
    hidden: np.ndarray  # (L, H) result_norm rows at the positions that predict y_1..y_L


@dataclass
class Extracted:
    prompt: list[int]
    target: list[int]  # answer tokens y_1..y_L (the template's target, newline included)
    key: np.ndarray  # (L·H,) mean of each key layer over the selected prompt rows (eq. 1, before Norm)
    R: np.ndarray | None  # (L, H) per-position R_t = W[y_t] − Wᵀp_t; (1, H) = their mean; None: not computed

    @property
    def R_mean(self) -> np.ndarray:
        """The paper's R_m (eq. 2): the mean of R_t over the answer positions."""
        return self.R.mean(axis=0)


def extract(engine: Engine, template: Template, x: str, y: str, *, skip_bos: bool,
            corrections: bool = True, top_k: int = 0, max_prompt_tokens: int | None = None,
            per_position: bool = True, defer: bool = False) -> Extracted | PendingR | None:
    """Returns None when the example carries no signal (empty answer, or R = 0).

    ``per_position=False`` computes only R_m (eq. 2, the mean), as one (1, H) row: in exact mode
    that is one pass over the LM head with the averaged distribution instead of one per position.

    ``max_prompt_tokens`` cuts the prompt as :func:`truncate_tokens` does (None: no cut).

    ``defer=True``: an example that takes the hidden route comes back as :class:`PendingR`, its R
    to be computed by :func:`finish_corrections` together with other examples'."""
    pt = prompt_and_target(engine, template, x, y, skip_bos=skip_bos, max_prompt_tokens=max_prompt_tokens)
    if pt is None:
        return None
    prompt, target, mask = pt
    if not corrections:
        s, n = key_pass.prompt_key(engine, prompt, mask)
        return Extracted(prompt, target, key_mean(s, n), None)
    engine.reset()
    # positions len(prompt)-1 .. len(prompt)+L-2 predict y_1..y_L
    flags = [False] * (len(prompt) - 1) + [True] * len(target) + [False]
    key_mask = mask + [False] * len(target)
    if top_k <= 0 and len(target) <= HIDDEN_R_MAX_TOKENS:
        # exact, short answer: llama.cpp stops after result_norm and one online-softmax pass over
        # the head gives R from the hidden rows (the head is read once, not twice)
        hidden = engine.hidden_states(prompt + target, flags, key_mask=key_mask)
        s, n = engine.key_sum()
        if defer:
            return PendingR(prompt, target, key_mean(s, n), hidden)
        R = engine.lm_head.correction_from_hidden(hidden, target, per_position=per_position)
    else:
        logits = engine.decode(prompt + target, flags, key_mask=key_mask)
        s, n = engine.key_sum()
        R = engine.lm_head.correction(logits, target, top_k=top_k, per_position=per_position)
    if not per_position:
        R = R.reshape(1, -1)
    if not np.any(R):
        return None
    return Extracted(prompt, target, key_mean(s, n), R)


def extract_keys(engine: Engine, template: Template, rows: list[tuple[str, str]], *, skip_bos: bool,
                 max_prompt_tokens: int | None = None) -> list[Extracted | None]:
    """:func:`extract` with ``corrections=False`` for many examples at once: their prompts are
    decoded together as separate sequences (``runtime.key_pass.prompt_keys``), which is what makes the
    default preset's ingest faster; keys equal the one-by-one ones within rounding (cosine > 0.999;
    in a memory's stored form at most 10% of the sign bits flip, and each key stays nearest its own
    input: tests/test_batched_keys.py)."""
    pts = [prompt_and_target(engine, template, x, y, skip_bos=skip_bos, max_prompt_tokens=max_prompt_tokens)
           for x, y in rows]
    live = [i for i, pt in enumerate(pts) if pt is not None]
    keys = key_pass.prompt_keys(engine, [pts[i][0] for i in live], [pts[i][2] for i in live])
    out: list[Extracted | None] = [None] * len(rows)
    for i, (s, n) in zip(live, keys):
        prompt, target, _ = pts[i]
        out[i] = Extracted(prompt, target, key_mean(s, n), None)
    return out


def finish_corrections(engine: Engine, pending: list[PendingR], per_position: bool) -> list[Extracted | None]:
    """Exact R of several deferred examples from ONE online-softmax pass over the LM head.

    The pass reads and dequantises each head row once for all their answer positions; each
    position keeps its own running maximum, normaliser and sum, so every R_t is bitwise the one
    a pass for its example alone gives, and R_m is summed as the kernel sums it (R_t / L in
    float32, in order). None where R = 0, as :func:`extract`."""
    if not pending:
        return []
    hidden = np.concatenate([p.hidden for p in pending])
    targets = [t for p in pending for t in p.target]
    R_all = engine.lm_head.correction_from_hidden(hidden, targets, per_position=True)
    out: list[Extracted | None] = []
    i = 0
    for p in pending:
        L = len(p.target)
        R = R_all[i:i + L]
        i += L
        if not per_position:
            m = np.zeros(R.shape[1], np.float32)
            for r in R:
                m += r / np.float32(L)
            R = m.reshape(1, -1)
        out.append(Extracted(p.prompt, p.target, p.key, R) if np.any(R) else None)
    return out
