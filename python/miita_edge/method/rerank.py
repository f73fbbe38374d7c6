"""Which of the vote's leading answers a query asks for, read by the model itself.

Why: taught with a few paraphrases per answer, the anchor vote hands 10-15% of the queries a
neighbouring intent's reply, whole (docs/evaluation.md, the dozen-intent sets): 1-bit keys of a
small model place "my card was stolen" near "my card is about to expire". The model can tell
them apart when it reads the replies: how much more likely the query makes a stored reply than an
empty query does (pointwise mutual information, PMI) is evidence the keys do not hold. Each of
the top ``top`` answers' vote weights is multiplied by exp(λ·PMI) and the top answers' mass is
shared out again (:func:`rerank_weights`); answers below them keep their weights.

Costs: one batched decode of each candidate's stored tokens after the query's prompt (the prompt's
KV cache is reused and restored), and once per answer and memory the same tokens after the empty
prompt (kept in the retrieval index, never stored: no budget bytes). A short answer (a label)
carries little evidence and the vote alone decides: rerank only where every candidate stores at
least ``min_tokens`` tokens (docs/method.md §15 measures both).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["context_answers", "context_priors", "continuation_logprob", "rerank_plan", "rerank_weights",
           "token_logprobs"]


def token_logprobs(logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """log softmax(logits[i])[tokens[i]] per row, in float64 (rows and tokens pair up)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return z[np.arange(len(tokens)), np.asarray(tokens, np.int64)] - lse


def continuation_logprob(engine, first_logits: np.ndarray, tokens: Sequence[int]) -> float:
    """log p(tokens | the sequence in the engine's KV cache), teacher forced: the first token from
    ``first_logits`` (the cache's last row, already computed), the rest from one decode of
    ``tokens[:-1]``, after which the cache is cut back to what it held."""
    toks = [int(t) for t in tokens]
    if not toks:
        return 0.0
    rows = np.asarray(first_logits, np.float32)[None]
    if len(toks) > 1:
        n0 = engine.n_past
        try:
            rows = np.vstack([rows, engine.decode(toks[:-1], "all")])
        finally:
            engine.truncate(n0)
    return float(token_logprobs(rows, toks).sum())


def context_answers(seqs: Sequence[Sequence[int]], n: int) -> list[int]:
    """Prototype ids of ``n + 1`` distinct stored answers spread evenly over the store's order
    (each answer by its first prototype), or of all of them where there are fewer: the contexts a
    ``"replies"`` baseline reads each answer after (:func:`context_priors`).

    Why ``n + 1``: an answer is never its own context, so each answer keeps ``n`` of them, and
    one decode of each context serves every answer."""
    first: dict[tuple, int] = {}
    for j, s in enumerate(seqs):
        first.setdefault(tuple(int(t) for t in s), j)
    ids = sorted(first.values())
    if len(ids) <= n + 1:
        return ids
    pos = np.round(np.linspace(0, len(ids) - 1, n + 1)).astype(np.int64)
    return [ids[int(p)] for p in pos]


def context_priors(engine, contexts: Sequence[tuple[Sequence[int], Sequence[int]]],
                   seqs: Sequence[Sequence[int]], n: int) -> dict[int, float]:
    """Each scored answer's mean log p(its tokens | a context's prompt) over its first ``n``
    contexts that are not the answer itself: the ``"replies"`` baseline of the rerank's PMI.

    ``contexts``: (context prompt tokens, answer ids to score after it); the caller lists under a
    context only answers other than the context's own. Why another answer as the
    context: the empty prompt says nothing of the domain, so a reply that any in-domain question
    makes likely (a "hub") gains PMI from every query; after other in-domain text it does not.
    The engine's cache is reset for each context and left holding the last one."""
    sums: dict[int, list[float]] = {}
    for ctx_prompt, ids in contexts:
        todo = [j for j in ids if len(sums.get(j, ())) < n]
        if not todo:
            continue
        engine.reset()
        first = engine.decode(list(ctx_prompt), "last")[0]
        for j in todo:
            sums.setdefault(j, []).append(continuation_logprob(engine, first, seqs[j]))
    return {j: float(np.mean(v)) for j, v in sums.items() if v}


def rerank_weights(weights: np.ndarray, pmi: np.ndarray, lam: float) -> np.ndarray:
    """The candidates' weights w_i·exp(λ·pmi_i), scaled to the mass Σ w_i they had: the vote's
    prior and the model's reading multiplied, in log space to stay finite."""
    w = np.asarray(weights, np.float64)
    if len(w) == 0:
        return w
    z = np.log(np.maximum(w, 1e-300)) + lam * np.asarray(pmi, np.float64)
    p = np.exp(z - z.max())
    return w.sum() * p / p.sum()


def rerank_plan(ids: np.ndarray, weights: np.ndarray, seqs: list, *, top: int, lam: float, min_tokens: int,
                query_logprob: Callable[[list[int]], float], prior_logprob: Callable[[int], float]
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """New weights for ``ids`` (their order kept) and the PMI of the top ones, or the weights as
    they were and None where nothing is reranked (one candidate, or a short one)."""
    ids = np.asarray(ids, np.int64)
    w = np.asarray(weights, np.float64)
    lead = np.argsort(-w, kind="stable")[:top]
    if len(lead) < 2 or any(len(seqs[int(ids[i])]) < min_tokens for i in lead):
        return w, None
    pmi = np.array([query_logprob([int(t) for t in seqs[int(ids[i])]]) - prior_logprob(int(ids[i]))
                    for i in lead])
    out = w.copy()
    out[lead] = rerank_weights(w[lead], pmi, lam)
    return out, pmi
