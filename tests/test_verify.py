"""The model reads the pair (method/verify.py): the rule, the log-probability it reads, which answers
it compares, and the evidence the bank keeps for it, each against a plain re-statement (numpy's
log-softmax over a fake model's rows, a brute-force gate over unpacked sign bits, the bank's arrays
written out), and the repair argument: a memory that lets its evidence go is the memory it would
have been without any."""
from __future__ import annotations

import math

import numpy as np
import pytest

from miita_edge.memory.bank import BankConfig, MemoryBank
from miita_edge.method import plan as plan_mod
from miita_edge.method.plan import RetrievalIndex, _verified
from miita_edge.method.relevance import GateDecision
from miita_edge.method.verify import EVIDENCE_MAX_TOKENS, VERIFY_MARGIN, VERIFY_PROMPT, VERIFY_TOP, \
    evidence_tokens, query_logprob, reach_confirmed


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("seed", range(100))
def test_reach_confirmed_is_numpy_argmax_at_the_nearest_after_the_margin(seed):
    """Restated: give the nearest answer the margin as a head start; it must then be numpy's argmax
    (the first of equal maxima)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(-8, 1, int(rng.integers(1, 6))).astype(float)  # small integers: ties happen
    for margin in (0.0, 1.0, VERIFY_MARGIN):
        head = s.copy()
        head[0] += margin
        assert reach_confirmed(s, margin) == (int(np.argmax(head)) == 0)
    assert reach_confirmed(s) == reach_confirmed(s, VERIFY_MARGIN)


# ---------------------------------------------------------------- the log-probability
class FakeEngine:
    """Characters as tokens (id = code point + 1, BOS 0); a row of logits depends only on the token at
    that position and the position, so the reference can recompute it without the engine."""

    def __init__(self, V=300, seed=0):
        rng = np.random.default_rng(seed)
        self.n_vocab = V
        self.W = rng.standard_normal((V, V)).astype(np.float32) * 3
        self.P = rng.standard_normal((512, V)).astype(np.float32)
        self.resets = 0
        self.decoded: list[list[int]] = []

    def tokenize(self, text, add_bos=True):
        return ([0] if add_bos else []) + [ord(c) + 1 for c in text]

    def detokenize(self, toks):
        return "".join(chr(int(t) - 1) for t in toks)

    def reset(self):
        self.resets += 1

    def decode(self, tokens, logits="last"):
        self.decoded.append(list(tokens))
        flags = logits
        return np.stack([self.W[t] + self.P[i] for i, (t, f) in enumerate(zip(tokens, flags)) if f]) \
            if any(flags) else np.zeros((0, self.n_vocab), np.float32)


def _ref_logprob(eng: FakeEngine, question: str, query: str) -> float:
    seq = [0] + [ord(c) + 1 for c in VERIFY_PROMPT.format(question=question) + query]
    start = len(seq) - len(query)
    total = 0.0
    for i in range(start, len(seq)):
        row = (eng.W[seq[i - 1]] + eng.P[i - 1]).astype(np.float64)
        lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
        total += row[seq[i]] - lse
    return total


@pytest.mark.parametrize("question,query", [("Who is my dentist?", "Who looks after my teeth?"),
                                            ("a", "b"), ("What is my wifi password?", "x" * 30)])
def test_query_logprob_is_the_sum_of_the_query_tokens_log_softmax(question, query):
    eng = FakeEngine()
    got = query_logprob(eng, question, query)
    assert got == pytest.approx(_ref_logprob(eng, question, query), abs=1e-6)
    full = [0] + [ord(c) + 1 for c in VERIFY_PROMPT.format(question=question) + query]
    assert eng.decoded[-1] == full[:-1]  # one pass; the last token predicts nothing that counts
    assert eng.resets >= 1  # the engine's KV cache is left reset, never holding the check's text


def test_evidence_keeps_a_questions_length_only():
    eng = FakeEngine()
    assert evidence_tokens(eng, "Who is my dentist?").tolist() == [ord(c) + 1 for c in "Who is my dentist?"]
    assert evidence_tokens(eng, "x" * EVIDENCE_MAX_TOKENS) is not None
    assert evidence_tokens(eng, "x" * (EVIDENCE_MAX_TOKENS + 1)) is None
    assert evidence_tokens(eng, "") is None


# ---------------------------------------------------------------- which answers are compared
def _index(rng, J, K, evidence, answers):
    bits = rng.standard_normal((J, K)) >= 0
    idx = RetrievalIndex(None, np.arange(J), np.zeros((J, 4), np.float32), [[int(a)] for a in answers],
                         np.packbits(bits, axis=1), key_dim=K, anchor_start=np.arange(J + 1, dtype=np.int64),
                         evidence=evidence)
    return idx, np.where(bits, 1.0, -1.0)


def _brute_force(S, q, ids, lead_pos, evidence, answers, score):
    """The rule in words: the retrieved answers ordered by their example's cosine to the query's
    bits (ties: earlier in ``ids``); the reach's answer, then each next answer holding its input
    whose answer is not yet compared, up to VERIFY_TOP; nothing to compare with, or the reach's
    answer holds no input: unchanged; else it must score at least every other compared one."""
    qb = np.where(q >= 0, 1.0, -1.0)
    cos = [float(S[j] @ qb) / len(qb) for j in ids]
    lead = ids[lead_pos]
    if evidence[lead] is None:
        return True
    compared = [lead]
    for i in sorted(range(len(ids)), key=lambda i: (-cos[i], i)):
        j = ids[i]
        if len(compared) == VERIFY_TOP:
            break
        if evidence[j] is not None and answers[j] not in {answers[c] for c in compared}:
            compared.append(j)
    if len(compared) == 1:
        return True
    s = [score[c] for c in compared]
    return max(s[1:]) <= s[0] + VERIFY_MARGIN


def test_the_compared_answers_and_the_decision_match_a_brute_force_restatement(monkeypatch):
    rng = np.random.default_rng(7)
    K, J = 24, 10
    checked = declined = 0
    for trial in range(400):
        answers = rng.integers(0, 7, J)  # some prototypes share an answer
        evidence = [np.array([j + 1], np.int32) if rng.random() < 0.7 else None for j in range(J)]
        idx, S = _index(rng, J, K, evidence, answers)
        ids = rng.choice(J, int(rng.integers(1, J + 1)), replace=False)
        q = rng.standard_normal(K).astype(np.float32)
        score = {j: float(rng.integers(-12, 1)) for j in range(J)}  # integers: ties at the margin happen
        monkeypatch.setattr(plan_mod, "query_logprob", lambda eng, question, query: score[int(question) - 1])

        class Eng:
            def detokenize(self, toks):
                return str(int(toks[0]))

        lead_pos = int(rng.integers(0, len(ids)))
        before = GateDecision(np.ones(len(ids), bool), None, lead_pos)
        got = _verified(before, idx, Eng(), q, ids, "the query")
        want = _brute_force(S, q, ids, lead_pos, evidence, answers, score)
        assert got.adapted == want, trial
        if want:
            assert got is before
        else:
            assert not got.keep.any() and got.reason.startswith("not confirmed")
            declined += 1
        checked += 1
        assert _verified(before, idx, Eng(), q, ids, None) is before  # no text: no check
    assert declined > 40 and checked - declined > 40  # both outcomes exercised


# ---------------------------------------------------------------- what the bank keeps
H = 16


def _bank(evidence=True) -> MemoryBank:
    cfg = BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True, anchor_fold="ward",
                     evidence=evidence)
    return MemoryBank(cfg, H)


def _writes(rng, n, answers=12):
    for i in range(n):
        answer = np.array([int(rng.integers(1, answers + 1)), 99], np.int32)
        ev = rng.integers(0, 1 << 24, int(rng.integers(1, 9))).astype(np.int32)
        yield np.zeros((0, H), np.float32), answer, rng.standard_normal(H).astype(np.float32), ev


def test_evidence_is_kept_while_an_answer_is_taught_once_and_round_trips():
    rng = np.random.default_rng(1)
    bank = _bank()
    first: dict[tuple, np.ndarray] = {}
    seen: dict[tuple, int] = {}
    for dirs, answer, key, ev in _writes(rng, 12):
        bank.write(dirs, answer, key, ev)
        seen[tuple(answer)] = seen.get(tuple(answer), 0) + 1
        first.setdefault(tuple(answer), ev)
    for p in bank.protos:
        if seen[tuple(p.tokens)] == 1:
            assert p.evidence.tolist() == first[tuple(p.tokens)].tolist()
        else:
            assert p.evidence is None
    assert any(p.evidence is not None for p in bank.protos) and any(p.evidence is None for p in bank.protos)
    arrays = bank.to_arrays()
    shapes = bank.to_arrays(shapes_only=True)
    assert {k: (v.shape, v.dtype) for k, v in arrays.items()} == {k: (v.shape, v.dtype) for k, v in shapes.items()}
    # the stored form written out: one length byte per prototype, then every token as 3 bytes
    lens = [0 if p.evidence is None else len(p.evidence) for p in bank.protos]
    assert arrays["ev_len"].tolist() == lens
    flat = [int(t) for p in bank.protos if p.evidence is not None for t in p.evidence]
    assert [int(r[0]) + 256 * int(r[1]) + 65536 * int(r[2]) for r in arrays["ev3"]] == flat
    back = MemoryBank.from_arrays(bank.config, H, arrays)
    assert [None if e is None else e.tolist() for e in back.evidence()] == \
           [None if p.evidence is None else p.evidence.tolist() for p in bank.protos]  # the view, read in place
    assert [None if p.evidence is None else p.evidence.tolist() for p in back.protos] == \
           [None if p.evidence is None else p.evidence.tolist() for p in bank.protos]
    again = back.to_arrays()
    assert all(again[k].tobytes() == arrays[k].tobytes() for k in arrays) and list(again) == list(arrays)


def test_a_bank_that_keeps_no_evidence_stores_none():
    rng = np.random.default_rng(2)
    bank = _bank(evidence=False)
    for dirs, answer, key, ev in _writes(rng, 6):
        bank.write(dirs, answer, key, ev)
    assert all(p.evidence is None for p in bank.protos)
    assert not {"ev_len", "ev3"} & set(bank.to_arrays())


@pytest.mark.parametrize("broken", ["no ev3", "no ev_len", "short ev3", "wide ev3", "ev_len int16"])
def test_inconsistent_evidence_arrays_are_refused(broken):
    rng = np.random.default_rng(3)
    bank = _bank()
    for dirs, answer, key, ev in _writes(rng, 5):
        bank.write(dirs, answer, key, ev)
    arrays = dict(bank.to_arrays())
    if broken == "no ev3":
        del arrays["ev3"]
    elif broken == "no ev_len":
        del arrays["ev_len"]
    elif broken == "short ev3":
        arrays["ev3"] = arrays["ev3"][:-1]
    elif broken == "wide ev3":
        arrays["ev3"] = np.zeros((len(arrays["ev3"]), 4), np.uint8)
    else:
        arrays["ev_len"] = arrays["ev_len"].astype(np.int16)
    with pytest.raises(ValueError, match="ev"):
        MemoryBank.from_arrays(bank.config, H, arrays).evidence()


def _size(bank: MemoryBank) -> int:
    from miita_edge.memory.store import encoded_size
    return encoded_size(bank.to_arrays(shapes_only=True), {"k": 1})


@pytest.mark.parametrize("room", [20, 60, 110, 150, 240, 4910])  # evicts, folds, drops some, none
def test_repair_lets_evidence_go_first_and_leaves_the_memory_it_would_have_been(room):
    """Written and repaired example by example (as ``learn`` does), a bank that keeps evidence ends
    with every other array byte for byte the one a bank without evidence ends with, whatever the
    budget: repair drops all evidence before it folds, narrows, merges or evicts anything. (Budgets
    are ``room`` bytes above an empty bank's file, so the cases hold in either store format.)"""
    budget = _size(_bank(True)) + room
    rng = np.random.default_rng(room + 90)  # format 2's empty bank is 90 bytes: the seeds it always had
    writes = list(_writes(rng, 30))
    banks = [_bank(True), _bank(False)]
    for dirs, answer, key, ev in writes:
        for b in banks:
            b.write(dirs, answer, key, ev)
            b.repair(budget, _size)
    with_ev, without = (b.to_arrays() for b in banks)
    rest = {k: v for k, v in with_ev.items() if k not in ("ev_len", "ev3")}
    assert list(rest) == list(without) and all(rest[k].tobytes() == without[k].tobytes() for k in rest)
    assert _size(banks[0]) <= budget
    kept = sum(p.evidence is not None for p in banks[0].protos)
    if room == 4910:
        assert kept > 0  # room for it: kept
    if room == 20:
        assert banks[1].n_prototypes < len({tuple(a) for _, a, _, _ in writes})  # repair evicted answers


def test_drop_evidence_takes_the_longest_then_the_oldest():
    bank = _bank()
    rng = np.random.default_rng(4)
    for j, n in enumerate([3, 5, 5, 1]):
        bank.write(np.zeros((0, H), np.float32), np.array([j + 1, 99], np.int32),
                   rng.standard_normal(H).astype(np.float32), np.arange(n, dtype=np.int32))
    order = []
    while bank.drop_evidence():
        order.append([j for j, p in enumerate(bank.protos) if p.evidence is None])
    assert order == [[1], [1, 2], [0, 1, 2], [0, 1, 2, 3]]
    assert not bank.drop_evidence()


def test_the_reach_answer_is_checked_with_the_real_model():
    """With the bundled model and the default preset: a memory of two answers each taught once; a query that repeats one's
    taught question in other words is left alone or steered by the check, never to the other, and
    an exact repeat is never checked. (The rule's numbers are tested above; here only that the
    engine decodes the check between the prompt pass and generation and answers still come.)"""
    pytest.importorskip("llama_cpp")
    import tempfile
    from pathlib import Path

    from miita_edge import Example, Miita
    with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", template="auto") as m:
        m.ingest([Example("Who is my dentist?", "Dr. Okafor"), Example("Who is my family doctor?", "Dr. Lindqvist")],
                 budget="none")
        assert all(e is not None for e in m.bank.evidence())
        a = m.ask("WHO IS MY DENTIST?")
        assert a.adapted and a.text.strip() == "Dr. Okafor"
        for q in ("Who looks after my teeth?", "Which tooth doctor am I registered with?"):
            a = m.ask(q)
            assert not (a.adapted and a.text.strip() == "Dr. Lindqvist"), q
        state = m.query_state("Who looks after my teeth?")
        assert state.text == "Who looks after my teeth?"
        lp = query_logprob(m.engine, "Who is my dentist?", "Who looks after my teeth?")
        assert math.isfinite(lp) and lp < 0
