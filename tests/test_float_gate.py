"""The gate's general-question tests on the float query against stored bits (Preset.gate_query =
"float"), against plain re-statements: per-prototype best scores by brute force over unpacked ±1
rows, and the gate's decision by its rule written out for each answer."""
import math

import numpy as np
import pytest

from miita_edge.method.plan import RetrievalIndex, float_best, float_best_all
from miita_edge.method.relevance import EXACT_REPEAT, gate


def _index(rng, per, K):
    A = int(sum(per))
    bits = rng.standard_normal((A, K)) >= 0
    owner = np.repeat(np.arange(len(per)), per)
    start = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    idx = RetrievalIndex(None, owner, np.zeros((len(per), 4), np.float32), [[] for _ in per],
                         np.packbits(bits, axis=1), key_dim=K, anchor_start=start)
    return idx, np.where(bits, 1.0, -1.0), owner


@pytest.mark.parametrize("K", [104, 40, 13])
def test_float_best_is_the_best_dot_with_a_stored_sign_row_over_root_k(K):
    rng = np.random.default_rng(K)
    per = [1, 3, 0, 2, 5, 1, 0]
    idx, S, owner = _index(rng, per, K)
    q = rng.standard_normal(K)
    q = (q / np.linalg.norm(q)).astype(np.float32)
    ref = np.array([max((float(S[a] @ q) / math.sqrt(K) for a in range(len(S)) if owner[a] == j), default=-np.inf)
                    for j in range(len(per))])
    np.testing.assert_allclose(float_best_all(idx, q), ref, atol=1e-5)
    ids = np.array([4, 2, 0])
    np.testing.assert_allclose(float_best(idx, q, ids), ref[ids], atol=1e-5)
    one, _, _ = _index(rng, [1, 2, 1], K)  # every prototype with anchors (the reduceat path)
    S1 = np.where(np.unpackbits(one.packed, axis=1)[:, :K] > 0, 1.0, -1.0)
    ref1 = [float(S1[0] @ q), float((S1[1:3] @ q).max()), float(S1[3] @ q)]
    np.testing.assert_allclose(float_best_all(one, q), np.array(ref1) / math.sqrt(K), atol=1e-5)


def test_the_general_question_tests_read_near_and_the_rest_reads_best():
    """Brute force over random answers: an answer is kept iff it is an exact repeat (bits), or it
    recurs, its bits-best reaches its radius and its float score beats max(null, floor); or, taught
    once, its bits-best reaches the paraphrase reach and its float score beats the same bar."""
    rng = np.random.default_rng(3)
    for trial in range(300):
        J, m = 9, 6
        ids = rng.choice(J, m, replace=False)
        counts = rng.integers(1, 4, J)
        radius = rng.uniform(0.2, 0.8, J)
        null = rng.uniform(0.2, 0.8, J)
        best = rng.uniform(0.0, 1.0, m)
        best[rng.random(m) < 0.05] = 1.0
        near = rng.uniform(0.0, 1.0, m)
        floor = float(rng.uniform(0.0, 0.6))
        reach = float(rng.uniform(0.3, 0.9)) if trial % 2 else None
        d = gate(ids, best, counts, radius, null, floor, reach=reach, near=near)
        for i, j in enumerate(ids):
            bar = max(null[j], floor)
            want = best[i] >= EXACT_REPEAT or (counts[j] >= 2 and best[i] >= radius[j] and near[i] > bar)
            if reach is not None:
                want = want or (counts[j] < 2 and best[i] >= reach and near[i] > bar)
            assert bool(d.keep[i]) == bool(want), (trial, i)


def test_without_near_the_gate_is_unchanged():
    rng = np.random.default_rng(4)
    ids = np.arange(5)
    args = (ids, rng.uniform(0, 1, 5), np.array([1, 2, 3, 2, 2]), rng.uniform(0, 1, 5), rng.uniform(0, 1, 5), 0.3)
    a, b = gate(*args), gate(*args, near=np.asarray(args[1]))
    np.testing.assert_array_equal(a.keep, b.keep)


def test_float_margin_is_the_nearest_generic_question_plus_one_standard_deviation():
    from miita_edge.method.plan import float_margin

    rng = np.random.default_rng(7)
    K = 80
    G = rng.standard_normal((40, K)) >= 0
    q = rng.standard_normal(K)
    q = (q / np.linalg.norm(q)).astype(np.float32)
    ref = max(float(np.where(g, 1.0, -1.0) @ q) for g in G) / math.sqrt(K) + 1 / math.sqrt(K)
    assert float_margin(q, np.packbits(G, axis=1), K) == pytest.approx(ref, abs=1e-5)
    assert float_margin(q, np.zeros((0, K // 8), np.uint8), K) == -np.inf
    # a random unit query against random sign rows: the score's spread is 1/sqrt(K)
    S = np.where(rng.standard_normal((4000, K)) >= 0, 1.0, -1.0)
    assert np.std(S @ q / math.sqrt(K)) == pytest.approx(1 / math.sqrt(K), rel=0.05)


def test_a_decline_by_the_general_questions_names_the_score_it_compared():
    ids = np.array([0, 1])
    d = gate(ids, np.array([0.9, 0.8]), np.array([3, 3]), np.array([0.1, 0.1]), np.array([0.5, 0.5]), 0.0,
             near=np.array([0.41, 0.2]))
    assert not d.keep.any() and "best cosine 0.410" in d.reason and "up to 0.500" in d.reason
