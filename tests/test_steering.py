"""Tests for miita_edge.method.steering against plain-Python brute force (loops, sorted(), math.exp)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miita_edge.method import steering
# ------------------------------------------------------------------ reference

def ref_cos(a, b) -> float:
    a = [float(x) for x in a]
    b = [float(x) for x in b]
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (max(na, 1e-12) * max(nb, 1e-12))


def ref_knn(k_q, anchors, owner, k, T):
    """Top-k anchors by cosine (ties: lower index), softmax(cos/T) summed per owner,
    ordered by weight descending then id ascending; also each owner's best anchor score."""
    scores = [ref_cos(a, k_q) for a in anchors]
    if not scores or k <= 0:
        return [], [], []
    top = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    z = [scores[i] / T for i in top]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    tot = sum(e)
    weight: dict[int, float] = {}
    best: dict[int, float] = {}
    for i, w in zip(top, e):
        j = int(owner[i])
        weight[j] = weight.get(j, 0.0) + w / tot
        best[j] = max(best.get(j, -math.inf), scores[i])
    ids = sorted(weight, key=lambda j: (-weight[j], j))
    return ids, [weight[j] for j in ids], [best[j] for j in ids]


def ref_vote(ids, weights, labels):
    acc, order = {}, []
    for j, w in zip(ids, weights):
        lab = labels[j]
        if lab not in acc:
            acc[lab] = 0.0
            order.append(lab)
        acc[lab] += float(w)
    best = 0
    for i, lab in enumerate(order):  # strict >: the first seen wins a tie
        if acc[lab] > acc[order[best]]:
            best = i
    return order[best] if order else None


def ref_prefix_direction(step, generated, seqs, ids, weights, dirs):
    acc = None
    for j, w in zip(ids, weights):
        seq = list(seqs[j])
        if len(seq) > step and seq[:step] == list(generated[:step]):
            d = [float(x) * float(w) for x in dirs[(int(j), step)]]
            acc = d if acc is None else [x + y for x, y in zip(acc, d)]
    if acc is None:
        return None
    n = math.sqrt(sum(x * x for x in acc))
    return None if n == 0 else [x / n for x in acc]


def check_knn(k_q, anchors, owner, k, T):
    ids, w, best = steering.knn_prototypes(k_q, anchors, owner, k, T)
    rids, rw, rbest = ref_knn(k_q, anchors, owner, k, T)
    assert ids.tolist() == rids
    assert np.allclose(w, rw, rtol=1e-9, atol=1e-12)
    assert np.allclose(best, rbest, rtol=1e-9, atol=1e-12)
    if rids:
        assert math.isclose(float(np.sum(w)), 1.0, rel_tol=1e-12)
    return ids, w, best


# ------------------------------------------------------------------ knn_prototypes


@settings(max_examples=150, deadline=None)
@given(A=st.integers(0, 25), J=st.integers(1, 6), k=st.integers(0, 30), T=st.sampled_from([0.02, 0.1, 1.0, 5.0]),
       dup=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_knn_matches_bruteforce(A, J, k, T, dup, seed):
    H = 16
    rng = np.random.default_rng(seed)
    anchors = rng.standard_normal((A, H)).astype(np.float32) * rng.uniform(0.1, 10, size=(A, 1)).astype(np.float32)
    if dup and A >= 2:  # exact score ties: repeated rows (also scaled copies)
        idx = rng.integers(0, A, size=A // 2)
        anchors[rng.integers(0, A, size=A // 2)] = anchors[idx]
    owner = rng.integers(0, J, size=A)
    k_q = rng.standard_normal(H).astype(np.float32)
    check_knn(k_q, anchors, owner, k, T)


def test_knn_ties_go_to_lower_anchor_index_and_lower_prototype_id():
    H = 4
    e = np.eye(H, dtype=np.float32)
    # anchors 0..3 all identical to the query direction; k = 2 must take anchors 0 and 1
    anchors = np.stack([e[0], e[0] * 2, e[0] * 3, e[0], e[1]])
    owner = np.array([3, 1, 0, 2, 4])
    ids, w, best = check_knn(e[0], anchors, owner, 2, 0.1)
    assert ids.tolist() == [1, 3]  # equal weights: lower id first
    assert np.allclose(w, [0.5, 0.5])
    assert np.allclose(best, [1.0, 1.0])
    # k = 4: anchors 0..3 (ids 3, 1, 0, 2), equal weight each
    ids, w, _ = check_knn(e[0], anchors, owner, 4, 0.1)
    assert ids.tolist() == [0, 1, 2, 3] and np.allclose(w, 0.25)


def test_knn_sums_weights_of_a_prototypes_anchors():
    q = np.array([1.0, 0.0, 0.0])
    anchors = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.2, 0.0], [0.0, 1.0, 0.0]])
    owner = np.array([0, 1, 1, 2])
    T = 0.5
    s = [1.0, 1 / math.sqrt(2), 1 / math.sqrt(1 + 1.44), 0.0]
    e = [math.exp(x / T) for x in s]
    w = {0: e[0] / sum(e), 1: (e[1] + e[2]) / sum(e), 2: e[3] / sum(e)}
    assert w[1] > w[0]  # two mediocre anchors outvote one perfect one
    ids, weights, best = check_knn(q, anchors, owner, 4, T)
    assert ids.tolist() == [1, 0, 2]
    assert np.allclose(weights, [w[1], w[0], w[2]])
    assert np.allclose(best, [s[1], s[0], s[3]])


def test_knn_empty_inputs():
    ids, w, best = steering.knn_prototypes(np.ones(4), np.zeros((0, 4)), np.zeros(0, int), 3, 0.1)
    assert ids.shape == w.shape == best.shape == (0,)
    ids, w, best = steering.knn_prototypes(np.ones(4), np.ones((2, 4)), np.array([0, 1]), 0, 0.1)
    assert ids.shape == (0,)


def test_anchor_scores_are_cosines():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((7, 9))
    q = rng.standard_normal(9)
    assert np.allclose(steering.anchor_scores(q, A), [ref_cos(a, q) for a in A], rtol=1e-12)
    assert steering.anchor_scores(q, np.zeros((0, 9))).shape == (0,)


# ------------------------------------------------------------------ vote


def test_vote_by_hand():
    labels = ["a", "b", "a", "c"]
    assert steering.vote(np.array([0, 1, 2, 3]), np.array([0.3, 0.4, 0.2, 0.1]), labels) == "a"  # 0.5 > 0.4
    assert steering.vote(np.array([1, 0]), np.array([0.5, 0.5]), labels) == "b"  # tie: first seen
    assert steering.vote(np.array([0, 1]), np.array([0.5, 0.5]), labels) == "a"
    assert steering.vote(np.array([], int), np.array([]), labels) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0])), max_size=10),
       st.lists(st.sampled_from(["x", "y", "z", 3, None]), min_size=8, max_size=8))
def test_vote_matches_bruteforce(pairs, labels):
    ids = np.array([p[0] for p in pairs], int)
    w = np.array([p[1] for p in pairs])
    assert steering.vote(ids, w, labels) == ref_vote(ids, w, labels)


# ------------------------------------------------------------------ prefix_direction


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), step=st.integers(0, 4), J=st.integers(0, 6))
def test_prefix_direction_matches_bruteforce(seed, step, J):
    H = 16
    rng = np.random.default_rng(seed)
    vocab = 3  # small vocabulary: many shared prefixes
    seqs = [rng.integers(0, vocab, size=rng.integers(0, 6)).tolist() for _ in range(J)]
    generated = rng.integers(0, vocab, size=rng.integers(step, step + 3)).tolist()
    if J and rng.random() < 0.5:  # often make one answer consistent with what was generated
        generated[:step] = (seqs[0] + [0] * step)[:step]
    ids = rng.permutation(J)[: rng.integers(0, J + 1)] if J else np.zeros(0, int)
    weights = rng.dirichlet(np.ones(len(ids))) if len(ids) else np.zeros(0)
    dirs = {(j, s): rng.standard_normal(H) for j in range(J) for s in range(8)}
    calls = []

    def dir_fn(j, s):
        calls.append((j, s))
        return dirs[(j, s)]

    got = steering.prefix_direction(step, generated, seqs, ids, weights, dir_fn)
    want = ref_prefix_direction(step, generated, seqs, ids, weights, dirs)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.dtype == np.float32
        assert np.allclose(got, want, atol=1e-6)
        assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-6
    # only consistent prototypes are asked for a direction, and only at this step
    consistent = [int(j) for j in ids if len(seqs[j]) > step and seqs[j][:step] == generated[:step]]
    assert calls == [(j, step) for j in consistent]


def test_prefix_direction_by_hand():
    e = np.eye(3)
    seqs = [[7, 8, 9], [7, 5], [7, 8], [4]]
    dirs = {(j, s): e[(j + s) % 3] for j in range(4) for s in range(3)}
    fn = lambda j, s: dirs[(j, s)]
    ids, w = np.array([0, 1, 2, 3]), np.array([0.4, 0.3, 0.2, 0.1])
    # step 0: every non-empty answer is consistent
    got = steering.prefix_direction(0, [], seqs, ids, w, fn)
    want = 0.4 * e[0] + 0.3 * e[1] + 0.2 * e[2] + 0.1 * e[0]
    assert np.allclose(got, want / np.linalg.norm(want))
    # step 2 after "7 8": only answer 0 is longer than 2 with that prefix (answer 2 ends there)
    got = steering.prefix_direction(2, [7, 8], seqs, ids, w, fn)
    assert np.allclose(got, e[2])
    # step 1 after "4": answer 3 has no position 1 -> nobody continues
    assert steering.prefix_direction(1, [4], seqs, ids, w, fn) is None
    # a prototype not retrieved does not count even when consistent
    assert steering.prefix_direction(1, [7], seqs, np.array([3]), np.array([1.0]), fn) is None


def test_duplicate_anchors_tie_exactly():
    """Identical stored anchors (routine with 'bit' keys: ±1 rows shared by several prototypes)
    must score identically wherever they sit, so the lower index wins."""
    rng = np.random.default_rng(4)
    H = 64
    for trial in range(20):
        row = np.where(rng.standard_normal(H) >= 0, 1.0, -1.0).astype(np.float32)
        A = int(rng.integers(5, 40))
        anchors = np.where(rng.standard_normal((A, H)) >= 0, 1.0, -1.0).astype(np.float32)
        pos = np.sort(rng.choice(A, size=4, replace=False))
        anchors[pos] = row
        q = row + 0.3 * rng.standard_normal(H).astype(np.float32)
        s = steering.anchor_scores(q, anchors)
        assert len(set(s[pos].tolist())) == 1
        owner = np.arange(A)[::-1]  # lower anchor index = higher prototype id
        ids, _, _ = check_knn(q, anchors, owner, 2, 0.1)
        assert sorted(ids.tolist()) == sorted(owner[pos[:2]].tolist())


def test_unit_anchor_fast_path_matches_reference_path():
    """The serving path (cached unit float32 anchors, BLAS scores, partition before sort)
    selects the same prototypes with the same weights as the float64 reference path."""
    from miita_edge.method.steering import knn_prototypes

    rng = np.random.default_rng(11)
    for n, H, k in ((3000, 64, 8), (500, 32, 4), (40, 16, 8)):
        B = rng.standard_normal((n, H))
        owner = rng.integers(0, 50, n)
        q = rng.standard_normal(H)
        ref = knn_prototypes(q, B, owner, k, 0.05)
        unit = (B / np.linalg.norm(B, axis=1, keepdims=True)).astype(np.float32)
        fast = knn_prototypes(q, unit, owner, k, 0.05, unit_anchors=True)
        np.testing.assert_array_equal(fast[0], ref[0])
        np.testing.assert_allclose(fast[1], ref[1], atol=1e-5)
        np.testing.assert_allclose(fast[2], ref[2], atol=1e-5)


# ------------------------------------------------------------------ the hold

def ref_hold_target(step, generated, seqs, ids, weights, min_tokens):
    """Brute force: the steering members (exact prefixes), each token's
    summed weight, the lead (largest; ties: the token met first in weight order), and whether the
    heaviest member giving the lead stores at least min_tokens tokens."""
    exact = [int(j) for j in ids if len(seqs[j]) > step and list(seqs[j][:step]) == list(generated[:step])]
    members = exact
    if not members:
        return None
    w = {int(j): float(x) for j, x in zip(ids, weights)}
    order = [int(j) for j in ids if int(j) in members]
    total, first_seen = {}, []
    for j in order:
        t = int(seqs[j][step])
        if t not in total:
            total[t] = 0.0
            first_seen.append(t)
        total[t] += w[j]
    lead = first_seen[0]
    for t in first_seen[1:]:
        if total[t] > total[lead]:
            lead = t
    heaviest = max((j for j in order if int(seqs[j][step]) == lead), key=lambda j: (w[j], -order.index(j)))
    if len(seqs[heaviest]) < min_tokens:
        return None
    return lead, frozenset(total)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), step=st.integers(0, 12), J=st.integers(0, 6),
       min_tokens=st.integers(1, 20))
def test_hold_target_matches_bruteforce(seed, step, J, min_tokens):
    rng = np.random.default_rng(seed)
    vocab = 3
    seqs = [rng.integers(0, vocab, size=rng.integers(0, 24)).tolist() for _ in range(J)]
    generated = (seqs[0] + [0] * step)[:step] if J and rng.random() < 0.6 else rng.integers(0, vocab, size=step).tolist()
    ids = rng.permutation(J)[: rng.integers(0, J + 1)] if J else np.zeros(0, int)
    weights = rng.dirichlet(np.ones(len(ids))) if len(ids) else np.zeros(0)
    if len(ids) > 1 and rng.random() < 0.3:
        weights = np.full(len(ids), 1.0 / len(ids))  # exact ties between tokens
    got = steering.hold_target(step, generated, seqs, ids, weights, min_tokens)
    assert got == ref_hold_target(step, generated, seqs, ids, weights, min_tokens)


def test_hold_target_by_hand():
    reply = list(range(10, 30))  # 20 tokens
    label = [10, 11]
    ids, w = np.array([0, 1]), np.array([0.7, 0.3])
    # both start with 10: the lead is 10, members {10}
    assert steering.hold_target(0, [], [reply, label], ids, w, 16) == (10, frozenset({10}))
    # the label alone leads (the reply dropped out): too short to hold
    assert steering.hold_target(1, [10], [[10, 99] + reply, label], ids, np.array([0.2, 0.8]), 16) is None
    # the reply leads at step 1 against the label's token
    assert steering.hold_target(1, [10], [reply, label], ids, w, 16) == (11, frozenset({11}))
    assert steering.hold_target(1, [10], [reply, [10, 5]], ids, w, 16) == (11, frozenset({11, 5}))
    assert steering.hold_target(3, [1, 2, 3], [reply], ids[:1], w[:1], 16) is None  # nothing steers


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), H=st.integers(2, 12), V=st.integers(2, 40),
       mult=st.sampled_from([1.0, 0.25]), with_precision=st.booleans())
def test_lead_push_puts_the_lead_one_margin_above_the_winner(seed, H, V, mult, with_precision):
    """Against a plain re-computation of the logits c·W(h + e): the lead ends exactly ``margin``
    above the token that led, along P(W_y − W_c)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, H))
    h = rng.standard_normal(H)
    z = mult * W @ h
    lead = int(rng.integers(0, V))
    P = None
    if with_precision:
        A = rng.standard_normal((H, H))
        P = A @ A.T + 0.1 * np.eye(H)  # symmetric positive definite, like the head's precision
    rows = lambda ids: W[np.asarray(ids)]  # noqa: E731
    e = steering.lead_push(z, lead, rows, P, mult, margin=0.5)
    c = int(np.argmax(z))
    if c == lead:
        assert e is not None and e.shape == (H,) and not np.any(e)
        return
    z2 = mult * W @ (h + e)
    assert z2[lead] - z2[c] == pytest.approx(0.5, abs=1e-9)
    u = (P if P is not None else np.eye(H)) @ (W[lead] - W[c])
    assert abs(abs(float(e @ u)) - np.linalg.norm(e) * np.linalg.norm(u)) < 1e-9 * (1 + np.linalg.norm(e) * np.linalg.norm(u))


def test_lead_push_cannot_separate_equal_rows():
    W = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    z = np.array([2.0, 1.0, 0.0])
    assert steering.lead_push(z, 1, lambda ids: W[np.asarray(ids)]) is None
    assert steering.lead_push(z, 0, lambda ids: W[np.asarray(ids)]).tolist() == [0.0, 0.0]
