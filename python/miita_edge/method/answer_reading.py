"""The model reads the answers: the vote's leading answers weighed by what the model says of each.

The vote ranks a memory's answers by keys alone, and under a tight budget a key is a hundred-odd
sign bits: on Banking77's dev rows at 1% the vote's first answer is right for 208 of 308 queries
(Gemma-3-270M) and 175 (SmolLM2-135M), while the right answer is among its four leading ones for
273 and 252 (``bench/rerank_probe.py``). The frozen model holds evidence the bits do not: how much
likelier it finds an answer after the query's prompt than after the same prompt with no query,

    PMI(y; x) = log P(y | prompt(x)) - log P(y | prompt("")),

the pointwise mutual information of answer and query under the model (the empty prompt takes out
what the model expects of any answer, such as short or frequent words). Alone it ranks the four
worse than the vote (173 and 163), but it errs elsewhere, so the two are multiplied: each leading
answer's vote weight times exp(lambda * PMI), a product of experts whose exponent lambda
(``Preset.answer_reading``) tempers the model's overconfidence. Answers outside the leading
``READ_TOP`` are dropped (their weight was small, and no reading of them was made).

Cost: one pass over the leading answers' tokens after the query's prompt (which the prompt pass has
already decoded), and, once per answer and memory version, one pass after the empty prompt. Only
labels are read (``reads``: answers shorter than a reply); a reply's many tokens, each scored over the
whole vocabulary, cost several times the reply's own generation for no measured gain.

The arithmetic (``leading_answers``, ``reweigh``) is pure and tested against brute-force
restatements; ``prompt_logprobs`` against numpy's log-softmax over a fake model's rows
(tests/test_answer_reading.py).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..runtime.branches import decode_branches
from .key_whitening import REPLY_MIN_TOKENS

__all__ = ["READ_TOP", "leading_answers", "log_softmax_at", "prompt_logprobs", "reads", "reweigh"]

#: How many of the vote's leading answers the model reads. The probe's choice on Banking77's dev rows
#: (bench/rerank_probe.py --top 4): the right answer is among the first 4 for 89% (Gemma) and 82%
#: (SmolLM2) of the queries at 1%, and each more answer read costs one more pass per query.
READ_TOP = 4


def reads(lengths: Sequence[int]) -> bool:
    """Whether the model reads these leading answers (their stored lengths in tokens): where there are
    two or more and every one is shorter than a reply (``REPLY_MIN_TOKENS``, the line the whitening
    and the hold draw). Replies are left to the vote: on the canned replies' dev rows the reading
    moved nothing beyond noise (Gemma -2.5 [-7.5, +2.5]) at 5.8 times a reply's time (four replies
    read token by token through a 262,144-word head), as versions 8-12's rerank of replies gained
    nothing (docs/method.md §5.1, §12)."""
    return len(lengths) >= 2 and all(0 < n < REPLY_MIN_TOKENS for n in lengths)


def leading_answers(answer: Sequence[int], weights: Sequence[float], top: int = READ_TOP) -> list[int]:
    """The ``top`` answers of largest summed weight over their prototypes (``answer[i]`` is prototype
    i's answer), largest first; ties go to the answer met first."""
    total: dict[int, float] = {}
    first: dict[int, int] = {}
    for i, (a, w) in enumerate(zip(answer, weights)):
        a = int(a)
        total[a] = total.get(a, 0.0) + float(w)
        first.setdefault(a, i)
    return sorted(total, key=lambda a: (-total[a], first[a]))[:top]


def reweigh(answer: Sequence[int], weights: Sequence[float], pmi: dict[int, float], lam: float) -> np.ndarray:
    """Each prototype's weight times exp(lam * PMI of its answer), renormalised; a prototype whose
    answer has no reading (not in ``pmi``) gets 0. Where every reading is very unlikely the
    exponents are shifted by their largest first, so nothing underflows to an all-zero vector."""
    w = np.asarray(weights, np.float64).reshape(-1)
    a = [int(x) for x in answer]
    ex = np.array([lam * pmi[x] if x in pmi else -math.inf for x in a], np.float64)
    if not np.isfinite(ex).any():
        return np.zeros_like(w)
    out = w * np.exp(ex - ex[np.isfinite(ex)].max())
    s = out.sum()
    return out / s if s > 0 else out


def log_softmax_at(row: np.ndarray, tok: int) -> float:
    """log softmax(row)[tok], the max taken out first: the exponentials in the row's own precision
    (float32 logits), their sum and the rest in float64. Within 1e-6 of an all-float64 log-softmax
    on a 262,144-word row, at an eighth of its time."""
    r = np.asarray(row)
    if r.dtype != np.float32:
        r = r.astype(np.float64)
    m = r.max()
    return float(r[tok]) - (float(m) + math.log(float(np.exp(r - m).sum(dtype=np.float64))))


def prompt_logprobs(engine, prompt: Sequence[int], seqs: Sequence[Sequence[int]],
                    last: np.ndarray | None = None) -> list[float]:
    """log P(seq | prompt) under ``engine``'s model for each of ``seqs`` (an empty one scores 0),
    summed over its tokens.

    ``last``: the prompt's last logits row, where ``engine`` holds exactly ``prompt`` (as
    ``Engine.query`` left it): the prompt is then not decoded again. Otherwise it is decoded once
    (from an empty cache). The answers' tokens are decoded after the prompt as branches of it
    (``runtime.branches.decode_branches``: together, in one decode where the context has the sequences), so
    the engine ends holding the prompt, as ``Engine.generate`` wants it."""
    prompt = [int(t) for t in prompt]
    if last is None:
        engine.reset()
        last = engine.decode(prompt, logits="last")[0].copy()
    seqs = [[int(t) for t in seq] for seq in seqs]
    branches = decode_branches(engine, [s[:-1] for s in seqs])
    out = []
    for s, rows in zip(seqs, branches):
        rows = [last] + list(rows)
        out.append(sum(log_softmax_at(r, t) for r, t in zip(rows, s)))
    return out
