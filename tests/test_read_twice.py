"""An answer taught by two distinct inputs keeps both (``BankConfig.evidence_inputs``): what the bank
keeps, against a plain re-statement of the rule over the examples written; how it is stored
(both inputs, one separator, 3 bytes a token, read back in place); and what the model's reading
scores for such an answer (the likeliest of its inputs), against the inputs read one by one."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.memory.bank import BankConfig, MemoryBank
from miita_edge.memory.prototype import EVIDENCE_SEP, evidence_inputs, joined_evidence
from miita_edge.method import plan as plan_mod

H = 16


def _bank(most: int) -> MemoryBank:
    cfg = BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True, anchor_fold="ward",
                     evidence=True, evidence_inputs=most)
    return MemoryBank(cfg, H)


def _expected(examples: list[tuple[int, list[int] | None]], most: int) -> dict[int, list[list[int]] | None]:
    """The rule restated over the examples in order, per answer: the distinct inputs it was taught,
    while none was missing (too long to keep) and there are at most ``most``; else None for good."""
    held: dict[int, list[list[int]] | None] = {}
    for answer, ev in examples:
        if answer not in held:
            held[answer] = None if ev is None else [ev]
        elif held[answer] is not None:
            if ev is None:
                held[answer] = None
            elif ev not in held[answer]:
                held[answer] = held[answer] + [ev] if len(held[answer]) < most else None
    return held


@pytest.mark.parametrize("most", [1, 2])
@pytest.mark.parametrize("seed", range(30))
def test_the_bank_keeps_what_the_rule_restated_keeps(seed, most):
    rng = np.random.default_rng(seed)
    bank = _bank(most)
    examples = []
    pool = {a: [rng.integers(0, EVIDENCE_SEP, int(rng.integers(1, 6))).tolist() for _ in range(3)] for a in range(1, 7)}
    for _ in range(int(rng.integers(4, 20))):
        a = int(rng.integers(1, 7))
        ev = None if rng.random() < 0.1 else pool[a][int(rng.integers(0, 3))]  # repeats of an input happen
        examples.append((a, ev))
        bank.write(np.zeros((0, H), np.float32), np.array([a, 99], np.int32), rng.standard_normal(H).astype(np.float32),
                   None if ev is None else np.array(ev, np.int32))
    want = _expected(examples, most)
    assert len(bank.protos) == len(want)  # one prototype per answer (a 'tokens' payload merges equal answers)
    for p in bank.protos:
        got = [x.tolist() for x in evidence_inputs(p.evidence)] if p.evidence is not None else None
        assert got == want[int(p.tokens[0])], (examples, int(p.tokens[0]))


def test_two_inputs_are_stored_with_one_separator_and_read_back():
    bank = _bank(2)
    rng = np.random.default_rng(3)
    for a, ev in [(1, [5, 6, 7]), (1, [8, 9]), (2, [10, 11]), (3, [12]), (3, [12])]:
        bank.write(np.zeros((0, H), np.float32), np.array([a, 99], np.int32), rng.standard_normal(H).astype(np.float32),
                   np.array(ev, np.int32))
    arrays = bank.to_arrays()
    assert arrays["ev_len"].tolist() == [6, 2, 1]  # [5,6,7] SEP [8,9]; [10,11]; [12] taught twice verbatim
    flat = [int(r[0]) + 256 * int(r[1]) + 65536 * int(r[2]) for r in arrays["ev3"]]
    assert flat == [5, 6, 7, (1 << 24) - 1, 8, 9, 10, 11, 12]
    back = MemoryBank.from_arrays(bank.config, H, arrays)
    assert [[x.tolist() for x in evidence_inputs(e)] for e in back.evidence()] == [[[5, 6, 7], [8, 9]], [[10, 11]], [[12]]]
    assert {k: (v.shape, v.dtype) for k, v in arrays.items()} == \
           {k: (v.shape, v.dtype) for k, v in bank.to_arrays(shapes_only=True).items()}


def test_joined_evidence_cases():
    a, b = np.array([1, 2], np.int32), np.array([3], np.int32)
    assert joined_evidence(a, a.copy(), 1) is a  # the same question again: unchanged, whatever the bound
    assert joined_evidence(a, b, 1) is None and joined_evidence(None, b, 2) is None and joined_evidence(a, None, 2) is None
    both = joined_evidence(a, b, 2)
    assert both.tolist() == [1, 2, EVIDENCE_SEP, 3]
    assert joined_evidence(both, np.array([4], np.int32), 2) is None and joined_evidence(both, b, 2) is both
    assert evidence_inputs(None) == [] and [x.tolist() for x in evidence_inputs(a)] == [[1, 2]]


def test_an_answers_reading_is_its_likeliest_input(monkeypatch):
    """``plan._reading`` against each input read alone: the maximum, and one read per input."""
    read = []

    def fake(engine, question, query):
        read.append(question)
        return -float(sum(map(ord, question)) % 97) - len(query)

    class Eng:
        def detokenize(self, toks):
            return "".join(chr(65 + int(t) % 26) for t in toks)

    monkeypatch.setattr(plan_mod, "query_logprob", fake)
    rng = np.random.default_rng(0)
    for _ in range(50):
        inputs = [rng.integers(0, 1000, int(rng.integers(1, 6))).astype(np.int32) for _ in range(int(rng.integers(1, 3)))]
        ev = inputs[0] if len(inputs) == 1 else joined_evidence(inputs[0], inputs[1], 2)
        read.clear()
        got = plan_mod._reading(Eng(), ev, "a query")
        each = [fake(Eng(), Eng().detokenize(x), "a query") for x in inputs]
        assert got == max(each) and len(read) == 2 * len(inputs)


def test_evidence_inputs_is_validated():
    with pytest.raises(ValueError, match="evidence_inputs"):
        BankConfig(evidence_inputs=3).validate()
    with pytest.raises(ValueError, match="evidence_inputs"):
        BankConfig(evidence_inputs=True).validate()
