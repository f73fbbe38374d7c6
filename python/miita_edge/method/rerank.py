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
least ``min_tokens`` tokens (docs/method.md, "Rerank: the model reads the leading replies", measures the
rerank; its constants table, at ``rerank_min_tokens``, the one probe of labels).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["channel_logprob", "continuation_logprob", "rerank_plan", "rerank_weights", "token_logprobs"]


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


def channel_logprob(engine, answer: Sequence[int], query: str) -> float:
    """log p(the query's tokens | "Answer: <answer>\nQuestion:"): how well a stored answer
    explains the query (the noisy channel; Min et al. 2022, "Noisy Channel Language Model
    Prompting for Few-Shot Text Classification"). Every candidate of one query scores the same
    tokens, so the query's own prior cancels where the weights are normalised and no baseline is
    needed: a reply that any in-domain question makes likely gains nothing from that. The engine's
    cache is reset and left holding this context."""
    text = engine.detokenize([int(t) for t in answer]).strip()
    engine.reset()
    first = engine.decode(engine.tokenize(f"Answer: {text}\nQuestion:"), "last")[0]
    return continuation_logprob(engine, first, engine.tokenize(" " + query.strip(), add_bos=False))


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
                query_logprob: Callable[[list[int]], float] | None, prior_logprob: Callable[[int], float],
                score: Callable[[int], float] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """New weights for ``ids`` (their order kept) and the PMI of the top ones, or the weights as
    they were and None where nothing is reranked (one candidate, or a short one). ``score``: each
    answer's reading by its id, used instead of the PMI (the channel score)."""
    ids = np.asarray(ids, np.int64)
    w = np.asarray(weights, np.float64)
    lead = np.argsort(-w, kind="stable")[:top]
    if len(lead) < 2 or any(len(seqs[int(ids[i])]) < min_tokens for i in lead):
        return w, None
    if score is not None:
        pmi = np.array([score(int(ids[i])) for i in lead], np.float64)
    else:
        pmi = np.array([query_logprob([int(t) for t in seqs[int(ids[i])]]) - prior_logprob(int(ids[i]))
                        for i in lead])
    out = w.copy()
    out[lead] = rerank_weights(w[lead], pmi, lam)
    return out, pmi
