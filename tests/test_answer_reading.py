"""The model reads the answers (method/answer_reading.py, plan._read_answers): the leading answers,
the reweighing and the log-probabilities it reads, each against a plain restatement (a brute-force
sum per answer, numpy's exp and argmax, numpy's log-softmax over a fake model's rows, and on the
real model one full decode of prompt and answer)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.method.answer_reading import READ_TOP, leading_answers, prompt_logprobs, reads, reweigh
from miita_edge.method.key_whitening import REPLY_MIN_TOKENS
from miita_edge.method.plan import RetrievalIndex, _read_answers
from miita_edge.method.presets import default_preset


# ---------------------------------------------------------------- the arithmetic
@pytest.mark.parametrize("seed", range(60))
def test_leading_answers_are_the_largest_sums_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    answer = rng.integers(0, 6, n).tolist()
    weights = (rng.integers(1, 4, n) / 4).tolist()  # coarse: equal sums happen
    got = leading_answers(answer, weights, READ_TOP)
    sums = {a: sum(w for b, w in zip(answer, weights) if b == a) for a in set(answer)}
    first = {a: answer.index(a) for a in set(answer)}
    ranked = sorted(sums, key=lambda a: (-sums[a], first[a]))
    assert got == ranked[:READ_TOP]
    for x, y in zip(got, got[1:]):  # each at least the next, an equal sum met earlier
        assert sums[x] > sums[y] or (sums[x] == sums[y] and first[x] < first[y])


@pytest.mark.parametrize("seed", range(60))
def test_reweigh_is_the_product_of_vote_and_reading(seed):
    """Restated: per answer, log(its vote share) + lam * PMI; the reweighed answer shares must be the
    softmax of that over the read answers (so the leading answer is numpy's argmax of the sum)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    answer = rng.integers(0, 6, n).tolist()
    weights = rng.random(n) + 1e-3
    weights /= weights.sum()
    lead = leading_answers(answer, weights.tolist(), READ_TOP)
    pmi = {a: float(rng.normal(0, 20)) for a in lead}
    lam = float(rng.choice([0.05, 0.1, 0.5, 3.0]))
    w = reweigh(answer, weights, pmi, lam)
    assert w.sum() == pytest.approx(1.0)
    share = {a: sum(weights[i] for i in range(n) if answer[i] == a) for a in lead}
    score = np.array([math.log(share[a]) + lam * pmi[a] for a in lead])
    ref = np.exp(score - score.max())
    ref /= ref.sum()
    got = np.array([w[[i for i in range(n) if answer[i] == a]].sum() for a in lead])
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
    for i in range(n):  # within an answer the vote's proportions stay; unread answers drop out
        if answer[i] not in pmi:
            assert w[i] == 0
        else:
            a = answer[i]
            assert w[i] == pytest.approx(got[lead.index(a)] * weights[i] / share[a], rel=1e-9, abs=1e-15)


def test_reweigh_survives_readings_far_below_zero():
    w = reweigh([0, 1], [0.5, 0.5], {0: -5000.0, 1: -5001.0}, 1.0)
    assert w.sum() == pytest.approx(1.0) and w[0] > w[1]
    assert not reweigh([0, 1], [0.5, 0.5], {}, 1.0).any()


# ---------------------------------------------------------------- the log-probabilities
class FakeEngine:
    """A row of logits depends only on the token at that position and the position; a KV cache of
    positions with ``holds``, ``truncate`` and ``reset`` as the real engine's."""

    def __init__(self, V=50, seed=0):
        rng = np.random.default_rng(seed)
        self.n_vocab = V
        self.W = rng.standard_normal((V, V)) * 3
        self.P = rng.standard_normal((256, V))
        self.seq: list[int] = []
        self.held: tuple = ()
        self.decoded = 0  # tokens decoded, over all calls

    def row(self, pos, tok):
        return self.W[tok] + self.P[pos]

    def reset(self):
        self.seq, self.held = [], ()

    def holds(self, tokens):
        return self.held == tuple(tokens) and len(self.seq) == len(tokens)

    def decode(self, tokens, logits="last"):
        start = len(self.seq)
        self.seq += list(tokens)
        self.decoded += len(tokens)
        rows = [self.row(start + i, t) for i, t in enumerate(tokens)]
        return np.stack(rows[-1:] if logits == "last" else rows)

    def truncate(self, n):
        self.seq = self.seq[:n]

    def decode_branches(self, branches):
        n = len(self.seq)
        out = []
        for br in branches:
            out.append(self.decode(br, logits="all") if br else np.zeros((0, self.n_vocab)))
            self.truncate(n)
        return out

    def query(self, tokens):
        self.reset()
        last = self.decode(tokens)[0]
        self.held = tuple(tokens)
        return last


@pytest.fixture(autouse=True)
def _fake_branches(monkeypatch):
    """The fake engine decodes its branches itself (one after another); the real one through
    runtime.branches, as the reading does."""
    import miita_edge.method.answer_reading as ar

    real = ar.decode_branches
    monkeypatch.setattr(ar, "decode_branches",
                        lambda eng, brs: eng.decode_branches(brs) if isinstance(eng, FakeEngine) else real(eng, brs))


def _ref(eng: FakeEngine, prompt, seq) -> float:
    full = list(prompt) + list(seq)
    total = 0.0
    for i in range(len(prompt), len(full)):
        r = eng.row(i - 1, full[i - 1])
        total += r[full[i]] - (np.log(np.sum(np.exp(r - r.max()))) + r.max())
    return total


@pytest.mark.parametrize("held", [False, True])
def test_prompt_logprobs_are_numpy_log_softmax_sums(held):
    eng = FakeEngine()
    prompt = [1, 7, 3, 9]
    seqs = [[4], [5, 6, 2], [], list(range(40))]
    last = eng.query(prompt) if held else None
    got = prompt_logprobs(eng, prompt, seqs, last=last)
    assert got == pytest.approx([_ref(eng, prompt, s) for s in seqs], abs=1e-9)
    assert got[2] == 0.0
    assert eng.seq == prompt  # left holding the prompt, each answer cut off again
    if held:  # the prompt is not decoded again
        assert eng.decoded == len(prompt) + 2 + 39


# ---------------------------------------------------------------- in the plan
def _index(seqs) -> RetrievalIndex:
    idx = RetrievalIndex(None, np.arange(len(seqs)), np.zeros((len(seqs), 1)), seqs, None)
    idx.null_prompt = [2, 3]
    return idx


class _State:
    def __init__(self, tokens, logits):
        self.tokens, self.logits = tokens, logits


def test_read_answers_matches_a_written_out_reading():
    """Five retrieved prototypes of four answers (two share one); the weights must be the vote's
    times exp(lam * (log P(answer | query prompt) - log P(answer | empty prompt))), recomputed here from
    the fake model's rows, the least answer outside the leading READ_TOP dropped when there are more."""
    eng = FakeEngine(seed=3)
    seqs = [[5, 6], [7], [5, 6], [8, 9, 10], [11], [12, 13]]
    idx = _index(seqs)
    ids = np.array([0, 1, 2, 3, 4, 5])
    weights = np.array([0.3, 0.25, 0.1, 0.2, 0.1, 0.05])
    best = np.linspace(0.9, 0.4, 6)
    prompt = [1, 4, 4]
    state = _State(prompt, eng.query(prompt))
    lam = 0.3
    got_ids, got_w, got_best = _read_answers(lam, idx, eng, state, ids, weights, best)
    answer = idx.answer_id()[ids].tolist()  # 0 and 2 share an answer
    lead = leading_answers(answer, weights.tolist(), READ_TOP)
    assert len(lead) == READ_TOP
    first = {a: int(ids[answer.index(a)]) for a in lead}
    pmi = {a: _ref(eng, prompt, seqs[first[a]]) - _ref(eng, idx.null_prompt, seqs[first[a]]) for a in lead}
    ref = np.array([weights[i] * math.exp(lam * pmi[answer[i]]) if answer[i] in pmi else 0.0 for i in range(6)])
    keep = ref > 0
    np.testing.assert_array_equal(got_ids, ids[keep])
    np.testing.assert_allclose(got_w, ref[keep] / ref.sum(), rtol=1e-9)
    np.testing.assert_array_equal(got_best, best[keep])
    assert set(idx.answer_null) == set(lead)
    # the empty prompt's readings are kept: a second query reads only its own prompt's
    before = eng.decoded
    state = _State(prompt, eng.query(prompt))
    _read_answers(lam, idx, eng, state, ids, weights, best)
    assert eng.decoded - before == len(prompt) + sum(len(seqs[first[a]]) - 1 for a in lead)


@pytest.mark.parametrize("lengths,want", [([3, 4], True), ([1, 15, 2, 9], True), ([3], False), ([], False),
                                          ([3, 16], False), ([40, 30], False), ([0, 3], False)])
def test_only_two_or_more_labels_are_read(lengths, want):
    assert REPLY_MIN_TOKENS == 16
    assert reads(lengths) is want


@pytest.mark.parametrize("seqs", [[[5, 6], list(range(1, REPLY_MIN_TOKENS + 1))],  # a reply among them
                                  [[5], [5]]])  # one answer (two prototypes of it)
def test_nothing_is_read_where_the_leading_answers_are_not_two_labels(seqs):
    eng = FakeEngine()
    idx = _index(seqs)
    _check_unread(eng, idx)


def test_nothing_is_read_without_an_empty_prompt_to_compare_with():
    """A template of the input alone on a model without BOS: the empty input's prompt has no token."""
    eng = FakeEngine()
    idx = _index([[5, 6], [7]])
    idx.null_prompt = []
    _check_unread(eng, idx)


def _check_unread(eng, idx):
    ids, w, b = np.array([0, 1]), np.array([0.6, 0.4]), np.array([0.9, 0.8])
    state = _State([1, 2], eng.query([1, 2]))
    out = _read_answers(0.1, idx, eng, state, ids, w, b)
    assert out[1] is w and eng.decoded == 2 and idx.answer_null is None


def test_the_preset_field_is_checked():
    p = default_preset()
    for bad in (-0.1, 11, True, "0.1"):
        p.answer_reading = bad
        with pytest.raises(StoreError, match="answer_reading"):
            p.validate_keys()


# ---------------------------------------------------------------- on the real model
def test_prompt_logprobs_match_a_fresh_decode_on_the_real_model(engine):
    """After the prompt pass (``Engine.query``), the answers read together as branches of the prompt
    give what a fresh decode of the prompt and then each answer gives, and what one decode of both
    together gives, within 0.1 nats (llama.cpp rounds a larger batch differently; the branches
    themselves: tests/test_branches.py), and the engine still holds the prompt."""
    pytest.importorskip("llama_cpp")
    prompt = engine.tokenize("Classify the banking customer query into an intent.\nQuery: where is my card?\nIntent:")
    seqs = [engine.tokenize(" card arrival\n", add_bos=False), engine.tokenize(" exchange rate\n", add_bos=False)]
    state = engine.query(prompt)
    got = prompt_logprobs(engine, prompt, seqs, last=np.asarray(state.logits))
    assert engine.holds(prompt)

    def lsm(rows, s):
        rows = np.asarray(rows, np.float64)
        return sum(float(r[t] - (np.log(np.exp(r - r.max()).sum()) + r.max())) for r, t in zip(rows, s))

    for s, g in zip(seqs, got):
        engine.reset()
        last = engine.decode(prompt, logits="last")
        assert g == pytest.approx(lsm(np.concatenate([last, engine.decode(s[:-1], logits="all")]), s), abs=0.1)
        engine.reset()
        both = engine.decode(prompt + s[:-1], logits=[False] * (len(prompt) - 1) + [True] * len(s))
        assert g == pytest.approx(lsm(both, s), abs=0.1)
    engine.reset()


@pytest.mark.parametrize("seed", range(3))
def test_log_softmax_at_on_a_float32_row_is_the_float64_one(seed):
    """The float32 exponentials (log_softmax_at's fast path for logits rows) against an all-float64
    numpy log-softmax of the same row, on a row as wide as Gemma's head."""
    from miita_edge.method.answer_reading import log_softmax_at

    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(262_144) * 4 + rng.standard_normal() * 20).astype(np.float32)
    r = row.astype(np.float64)
    ref = r - (r.max() + np.log(np.exp(r - r.max()).sum()))
    for tok in rng.integers(0, len(row), 5).tolist() + [int(row.argmax())]:
        assert abs(log_softmax_at(row, tok) - ref[tok]) < 1e-6
