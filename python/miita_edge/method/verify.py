"""The model reads the pair: is a query a rewording of the example an answer was taught by?

An answer taught once is trusted by the paraphrase reach (docs/method.md §5) where the query's key
comes as near its example as the model's paraphrases come. Keys of a small model put everyday
questions of one form ("who is my dentist?", "who is my family doctor?") about as near each other
as a paraphrase, so the nearest example is often another answer's. The model itself separates them
far better when it reads the two texts together: how likely it finds the query as a rewording of
one taught question against another (log P(query | VERIFY_PROMPT with that question)). So where
the reach alone trusts the nearest answer, the memory asks the model how likely the query is after
each of the nearest few answers' taught questions, and steers only if no other answer's question
makes it more than ``VERIFY_MARGIN`` nats likelier than the nearest answer's own; otherwise the
frozen model answers. The check only ever withholds the reach's answer: it never
hands the query to another answer.

What it needs that keys do not hold: the taught input's tokens (``Prototype.evidence``), kept for
an answer taught once (or by two inputs, ``BankConfig.evidence_inputs``: then both) while each input
is a question's length (``EVIDENCE_MAX_TOKENS``), counted in the budget and the first thing repair
lets go (``MemoryBank.drop_evidence``).

Pure functions of an engine's log-probabilities; the rule itself (``reach_confirmed``) is a function
of numbers, tested against a brute-force restatement (tests/test_verify.py).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .answer_reading import log_softmax_at
from .templates import folded_text

__all__ = ["EVIDENCE_MAX_TOKENS", "READ_NEUTRAL", "VERIFY_MARGIN", "VERIFY_PROMPT", "VERIFY_TOP", "evidence_reader",
           "evidence_tokens", "query_logprob", "reach_confirmed", "read_confirmed"]

#: The text the model reads a taught question in: the query follows it as the question's rewording.
#: Written for this; one of two wordings compared on the personal facts' dev half (docs/method.md §5).
VERIFY_PROMPT = "Question: {question}\nThe same question in other words: "
#: How many of the nearest answers (by best cosine, those holding their taught input) the model
#: compares. Chosen on the personal facts' dev half among 2 to 5 (docs/method.md §11).
VERIFY_TOP = 4
#: How much likelier (in nats of log-probability, e^3 ≈ 20 times) another answer's taught question must
#: make the query before the reach's answer is withheld. Chosen on the personal facts' dev half, both
#: models: the margin that avoids the most answers of another fact net of the right answers it loses,
#: ties to the larger margin (docs/method.md §11).
VERIFY_MARGIN = 3.0
#: The question the model reads a query after when it asks how likely the query is as a rewording
#: of no taught question in particular: the reading's baseline (``read_confirmed``). Written for
#: this; a question about nothing, so it predicts no content word of any query.
READ_NEUTRAL = "What is this about?"
#: The longest input kept as evidence, in the model's tokens: a question, not a document. By
#: construction: the check costs one pass over the input and the query for each compared answer,
#: and an input that long (an instruction with its context, a paragraph) is not a question a user
#: rewords; such answers keep the reach without the check.
EVIDENCE_MAX_TOKENS = 64


def evidence_tokens(engine, text: str) -> np.ndarray | None:
    """The tokens kept as an answer's evidence for ``text`` (its input, folded as keys fold it), or
    None where it is longer than ``EVIDENCE_MAX_TOKENS`` or empty."""
    toks = engine.tokenize(text, add_bos=False)
    if not toks or len(toks) > EVIDENCE_MAX_TOKENS:
        return None
    return np.asarray(toks, np.int32)


def evidence_reader(engine):
    """What ``ingest.learn`` keeps of an example as its answer's evidence: its input folded as keys
    fold it (``templates.folded_text``), tokenised (``evidence_tokens``)."""
    return lambda example: evidence_tokens(engine, folded_text(example.input))


def query_logprob(engine, question: str, query: str) -> float:
    """log P(query | VERIFY_PROMPT around ``question``) under the engine's model, plain text with
    BOS, summed over the query's tokens (where the joint tokenisation splits differently at the
    seam, the tokens after the longest common prefix count). Decodes on ``engine`` (its KV cache
    no longer holds an earlier prompt; ``Engine.generate`` decodes that again)."""
    head = VERIFY_PROMPT.format(question=question)
    a = engine.tokenize(head, add_bos=True)
    b = engine.tokenize(head + query, add_bos=True)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    n = max(n, 1)
    if n >= len(b):
        return 0.0
    engine.reset()
    flags = [False] * (n - 1) + [True] * (len(b) - n)  # the row before each query token predicts it
    rows = engine.decode(b[:-1], logits=flags) if len(b) > 1 else np.zeros((0, engine.n_vocab), np.float32)
    engine.reset()
    return float(sum(log_softmax_at(row, tok) for row, tok in zip(rows, b[n:])))


def reach_confirmed(scores: Sequence[float], margin: float = VERIFY_MARGIN) -> bool:
    """The rule: the nearest answer (``scores[0]``, the log-probability of the query given its taught
    question) is confirmed where no other compared answer's question makes the query more than
    ``margin`` likelier (log-probability higher by more than ``margin``). One score: nothing to
    compare with, confirmed."""
    s = [float(x) for x in scores]
    return all(x - s[0] <= margin for x in s[1:])


def read_confirmed(scores: Sequence[float], neutral: float, threshold: float,
                   margin: float = VERIFY_MARGIN) -> bool:
    """The reading's rule, where it decides for an answer that keeps its taught inputs
    (``Preset.read_reach``): the nearest answer (``scores[0]``, the log-probability of the query
    after its taught question, the likeliest where it was taught two ways) is
    trusted where its question makes the query at least ``threshold`` nats likelier than the
    neutral question does (``neutral``: the query after ``READ_NEUTRAL``), and at least ``margin``
    nats likelier than any other compared answer's question does. The first says the taught
    question tells the model much about the query (a rewording, not merely a question of the same
    form); the second, that no other taught question tells it about as much."""
    s = [float(x) for x in scores]
    return s[0] - float(neutral) >= threshold and all(s[0] - x >= margin for x in s[1:])
