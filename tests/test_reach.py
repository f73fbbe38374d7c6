"""One taught example reaches as far as the model's paraphrases do, and the memory abstains rather
than hand a query to another answer: ``relevance.gate(reach=..., abstain=True)`` and
``relevance.paraphrase_reach``, each against a brute-force re-statement of the rule on synthetic
memories."""
from __future__ import annotations


import numpy as np
import pytest

from miita_edge.method.relevance import EXACT_REPEAT, gate, paraphrase_reach


def reference_keep(best, counts, radius, null, floor, reach, abstain):
    """The rule in words, one answer at a time: an answer may steer when the query repeats one of
    its examples exactly; or when it was taught at least twice, the query is within its radius and
    beats its null and the query's floor; or when it was taught once, the query is at least the
    model's paraphrase reach near its example and beats the null and the floor. With ``abstain``,
    if the answer with the highest best cosine (first on ties) may not steer, none may."""
    out = []
    for b, n, r, z in zip(best, counts, radius, null):
        bar = max(z, floor)
        if b >= EXACT_REPEAT:
            out.append(True)
        elif n >= 2:
            out.append(b >= r and b > bar)
        else:
            out.append(reach is not None and b >= reach and b > bar)
    lead = int(np.argmax(best))  # numpy's argmax: the first of equal maxima
    if abstain and any(out) and not out[lead]:
        return [False] * len(out)
    return out


@pytest.mark.parametrize("seed", range(200))
def test_gate_equals_the_rule_stated_answer_by_answer(seed):
    rng = np.random.default_rng(seed)
    m, J = int(rng.integers(1, 7)), 12
    ids = rng.choice(J, m, replace=False)
    grid = np.round(np.linspace(0.2, 1.0, 9), 3)  # a coarse grid: ties and exact repeats happen
    best = rng.choice(grid, m)
    counts = rng.integers(1, 4, J)
    radius = rng.choice(grid, J)
    null = rng.choice(grid, J) if rng.random() < 0.7 else None
    floor = float(rng.choice(grid)) if rng.random() < 0.5 else -np.inf
    reach = float(rng.choice(grid)) if rng.random() < 0.7 else None
    abstain = bool(rng.random() < 0.6)
    d = gate(ids, best, counts, radius, null, floor, reach=reach, abstain=abstain)
    want = reference_keep(best, counts[ids], radius[ids], null[ids] if null is not None else [-np.inf] * m,
                          floor, reach, abstain)
    assert d.keep.tolist() == want
    assert (d.reason is None) == any(want)


def test_a_declined_nearest_answer_is_not_replaced_by_a_trusted_farther_one():
    # answer 0 (taught once, query not near enough) is nearest; answer 1 (taught twice) passes alone
    ids, best = np.array([0, 1]), np.array([0.60, 0.55])
    counts, radius = np.array([1, 2]), np.array([1.0, 0.5])
    assert gate(ids, best, counts, radius, reach=0.7).keep.tolist() == [False, True]
    d = gate(ids, best, counts, radius, reach=0.7, abstain=True)
    assert d.keep.tolist() == [False, False] and "not trusted" in d.reason
    # near enough, answer 0 is trusted on one example, and both steer
    assert gate(ids, best, counts, radius, reach=0.6, abstain=True).keep.tolist() == [True, True]


def _bits(v: np.ndarray) -> np.ndarray:
    return np.packbits(v >= 0, axis=1)


def reference_reach(keys: np.ndarray, groups: list[int]) -> float:
    """Every candidate threshold tried against every pair, in plain Python."""
    K = keys.shape[1]
    sign = keys >= 0
    cos = [[(K - 2 * int((sign[i] != sign[j]).sum())) / K for j in range(len(keys))] for i in range(len(keys))]
    sib, non = [], []
    for i in range(len(keys)):
        s = [cos[i][j] for j in range(len(keys)) if j != i and groups[j] == groups[i]]
        o = [cos[i][j] for j in range(len(keys)) if groups[j] != groups[i]]
        if s:
            sib.append(max(s))
        if o:
            non.append(max(o))
    best, best_j = None, None
    for t in sorted(set(sib) | set(non)):
        j = sum(x >= t for x in sib) / len(sib) - sum(x >= t for x in non) / len(non)
        if best_j is None or j > best_j:
            best, best_j = t, j
    return best


@pytest.mark.parametrize("seed", range(20))
def test_paraphrase_reach_is_the_best_separating_threshold(seed):
    rng = np.random.default_rng(seed)
    G, per, K = 8, 3, 64
    centres = rng.standard_normal((G, K))
    keys = np.concatenate([c + rng.uniform(0.3, 1.5) * rng.standard_normal((per, K)) for c in centres])
    groups = [g for g in range(G) for _ in range(per)]
    assert paraphrase_reach(_bits(keys), np.array(groups), K) == pytest.approx(reference_reach(keys, groups))


def test_paraphrase_reach_is_high_for_tight_groups_and_needs_both_kinds_of_pair():
    rng = np.random.default_rng(0)
    K = 128
    centres = rng.standard_normal((6, K))
    tight = np.concatenate([c + 0.05 * rng.standard_normal((3, K)) for c in centres])
    assert paraphrase_reach(_bits(tight), np.repeat(np.arange(6), 3), K) > 0.8
    assert paraphrase_reach(_bits(tight[:3]), np.zeros(3, int), K) == np.inf  # no non-sibling: reaches nothing
