"""The model's reading decides for an answer taught once (``Preset.read_reach``): the rule
(``verify.read_confirmed``), the gate's hand-over (``relevance.gate(readable=...)``) and the plan's
decision (``plan._read``), each against a plain restatement: numpy over the scores, a brute-force
gate over unpacked sign bits, the compared answers written out."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method import plan as plan_mod
from miita_edge.method.plan import _read
from miita_edge.method.presets import READ_REACH, default_preset
from miita_edge.method.relevance import EXACT_REPEAT, GateDecision, gate
from miita_edge.method.verify import READ_NEUTRAL, VERIFY_MARGIN, VERIFY_TOP, read_confirmed
from test_verify import _index  # a retrieval index of random sign bits, as version 17's check is tested on


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("seed", range(100))
def test_read_confirmed_is_a_threshold_over_the_neutral_and_a_lead_over_every_other(seed):
    rng = np.random.default_rng(seed)
    s = rng.integers(-30, 1, int(rng.integers(1, 6))).astype(float)  # integers: ties at both lines happen
    neutral = float(rng.integers(-40, 0))
    for threshold in (0.0, 5.0, READ_REACH):
        for margin in (0.0, 1.0, VERIFY_MARGIN):
            pmi_ok = s[0] - neutral >= threshold
            others = np.delete(s, 0)
            lead_ok = not len(others) or bool(np.all(s[0] - others >= margin))
            assert read_confirmed(s, neutral, threshold, margin) == (pmi_ok and lead_ok)
    assert read_confirmed(s, neutral, READ_REACH) == read_confirmed(s, neutral, READ_REACH, VERIFY_MARGIN)


# ---------------------------------------------------------------- the gate's hand-over
def reference_gate(best, counts, radius, null, floor, reach, readable):
    """The default gate (abstaining) with the reading, in words: the nearest retrieved answer
    (highest best cosine, ties: the first) decides. An exact repeat steers. A readable nearest answer
    is left to the reading where it beats its null and the floor, else nothing steers. Otherwise each
    answer is trusted as before (recurring within its radius, or taught once within the reach, and
    beating its null and the floor), readable answers never by the reach; nothing steers unless the
    nearest is trusted. Returns ("read", lead), ("keep", mask) or ("none", None)."""
    m = len(best)
    lead = 0
    for i in range(1, m):
        if best[i] > best[lead]:
            lead = i
    z = [max(null[i], floor) for i in range(m)]
    if readable[lead] and best[lead] < EXACT_REPEAT:
        return ("read", lead) if best[lead] > z[lead] else ("none", None)
    keep = []
    for i in range(m):
        if best[i] >= EXACT_REPEAT:
            keep.append(True)
        elif counts[i] >= 2:
            keep.append(best[i] >= radius[i] and best[i] > z[i])
        else:
            keep.append(not readable[i] and best[i] >= reach and best[i] > z[i])
    if not keep[lead]:
        return ("none", None)
    return ("keep", np.array(keep))


@pytest.mark.parametrize("seed", range(300))
def test_gate_with_reading_equals_the_rule_stated_answer_by_answer(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 7))
    ids = np.arange(m)
    best = np.round(rng.uniform(0.2, 1.0, m), 2)  # rounded: ties between answers happen
    if rng.random() < 0.2:
        best[int(rng.integers(0, m))] = 1.0
    counts = rng.integers(1, 4, m)
    radius = np.round(rng.uniform(0.3, 0.9, m), 2)
    null = np.round(rng.uniform(0.2, 0.7, m), 2)
    floor = float(np.round(rng.uniform(0.1, 0.6), 2))
    reach = float(np.round(rng.uniform(0.4, 0.9), 2))
    readable = (counts == 1) & (rng.random(m) < 0.7)
    got = gate(ids, best, counts, radius, null, floor, reach=reach, abstain=True, readable=readable)
    kind, want = reference_gate(best.tolist(), counts.tolist(), radius.tolist(), null.tolist(), floor, reach,
                                readable.tolist())
    if kind == "read":
        assert got.read_lead == want and not got.keep.any()
    elif kind == "none":
        assert got.read_lead == -1 and not got.keep.any()
    else:
        assert got.read_lead == -1 and got.keep.tolist() == want.tolist()


def test_without_readable_answers_the_gate_is_the_reach_gate():
    rng = np.random.default_rng(3)
    for _ in range(200):
        m = int(rng.integers(1, 6))
        best, null = rng.uniform(0.2, 1, m), rng.uniform(0.2, 0.7, m)
        counts, radius = rng.integers(1, 3, m), rng.uniform(0.3, 0.9, m)
        a = gate(np.arange(m), best, counts, radius, null, 0.3, reach=0.6, abstain=True)
        b = gate(np.arange(m), best, counts, radius, null, 0.3, reach=0.6, abstain=True, readable=np.zeros(m, bool))
        assert a.keep.tolist() == b.keep.tolist() and a.reason == b.reason and b.read_lead == -1


# ---------------------------------------------------------------- the plan's decision
def test_read_decides_by_the_compared_answers_written_out(monkeypatch):
    rng = np.random.default_rng(11)
    K, J = 24, 10
    steered = declined = 0
    for trial in range(400):
        answers = rng.integers(0, 7, J)
        evidence = [np.array([j + 1], np.int32) if rng.random() < 0.7 else None for j in range(J)]
        idx, S = _index(rng, J, K, evidence, answers)
        ids = rng.choice(J, int(rng.integers(1, J + 1)), replace=False)
        with_ev = [i for i in range(len(ids)) if evidence[ids[i]] is not None]
        if not with_ev:
            continue
        lead_pos = with_ev[int(rng.integers(0, len(with_ev)))]
        q = rng.standard_normal(K).astype(np.float32)
        score = {j: float(rng.integers(-30, 1)) for j in range(J)}
        neutral = float(rng.integers(-40, -5))

        def logprob(eng, question, query):
            assert query == "The query"  # read as keys fold it
            return neutral if question == READ_NEUTRAL else score[int(question) - 1]

        monkeypatch.setattr(plan_mod, "query_logprob", logprob)

        class Eng:
            def detokenize(self, toks):
                return str(int(toks[0]))

        got = _read(GateDecision(np.zeros(len(ids), bool), "left to the model's reading", read_lead=lead_pos),
                    idx, Eng(), q, ids, "THE QUERY", READ_REACH)
        # the compared answers written out: the lead, then by cosine to the query's bits (ties: earlier)
        qb = np.where(q >= 0, 1.0, -1.0)
        cos = [float(S[j] @ qb) / K for j in ids]
        lead = ids[lead_pos]
        compared = [lead]
        for i in sorted(range(len(ids)), key=lambda i: (-cos[i], i)):
            if len(compared) == VERIFY_TOP:
                break
            j = ids[i]
            if evidence[j] is not None and answers[j] not in {answers[c] for c in compared}:
                compared.append(j)
        s = [score[c] for c in compared]
        want = s[0] - neutral >= READ_REACH and all(s[0] - x >= VERIFY_MARGIN for x in s[1:])
        assert got.adapted == want, trial
        if want:
            assert got.keep.tolist() == [answers[j] == answers[lead] for j in ids] and got.reason is None
            steered += 1
        else:
            assert got.reason.startswith("not confirmed")
            declined += 1
    assert steered > 30 and declined > 30


def test_read_reach_is_a_number_of_nats_the_preset_checks():
    from miita_edge.errors import StoreError
    p = default_preset()
    p.read_reach = -1.0
    with pytest.raises(StoreError, match="read_reach"):
        p.validate_keys()
