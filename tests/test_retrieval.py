"""Tests of eqs. 6-11 (retrieval.py), each against an independent reference.

References used here never call the function under test: finite differences
of the entropy (eqs. 6, 7, 9), plain-Python loops over prototypes and anchors
(eqs. 8-10) and per-row loops (eq. 11).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from miita_edge.errors import InputError
from miita_edge.method.retrieval import (
    ScanIndex,
    MODES,
    RetrievalConfig,
    aggregate,
    candidate_set,
    cosine_matrix,
    gate,
    normalize,
    oracle_alignment,
    restricted_entropy_grad,
    retrieve,
    score,
    select_and_weight,
    semantic_scores,
    top_indices,
    top_k_restricted,
    uncertainty_direction,
    uncertainty_utility,
)

EPS = 1e-8


# ------------------------------------------------------------ references
def ref_entropy_of_logits(z: np.ndarray) -> float:
    """H(softmax(z)) in float64, written independently of the module."""
    z = np.asarray(z, dtype=np.float64)
    m = z.max()
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return -sum(math.exp(v - lse) * (v - lse) for v in z)


def fd_grad(f, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """Central finite differences of a scalar function."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        out.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


def ref_cos(a, b) -> float:
    na = math.sqrt(sum(float(v) * float(v) for v in a))
    nb = math.sqrt(sum(float(v) * float(v) for v in b))
    return sum(float(x) * float(y) for x, y in zip(a, b)) / ((na + EPS) * (nb + EPS))


def ref_top(scores, R) -> list[int]:
    idx = [j for j in range(len(scores)) if math.isfinite(scores[j])]
    return sorted(idx, key=lambda j: (-scores[j], j))[:R]


def ref_semantic(k_q, anchors, owner, J) -> list[float]:
    out = []
    for j in range(J):
        best = -math.inf
        for a, o in zip(anchors, owner):
            if o == j:
                best = max(best, ref_cos(k_q, a))
        out.append(best)
    return out


def ref_restricted(logits, k):
    """top-k by (-logit, id), probabilities from the FULL softmax, renormalised."""
    V = len(logits)
    m = max(logits)
    full = [math.exp(v - m) for v in logits]
    Z = sum(full)
    full = [v / Z for v in full]
    ids = sorted(range(V), key=lambda i: (-logits[i], i))[: min(k, V)]
    s = sum(full[i] for i in ids)
    return ids, [full[i] / s for i in ids]


def ref_g(p):
    H = -sum(v * math.log(v) for v in p if v > 0)
    return [-v * (math.log(v) + H) if v > 0 else 0.0 for v in p], H


def ref_pipeline(k_q, anchors, owner, D, logits, W, cfg):
    """eqs. 6-10 in plain Python; W is the dense (V, H) LM head."""
    J, H = D.shape
    S = ref_semantic(k_q, anchors, owner, J)
    ids, p = ref_restricted(list(logits), cfg.K_v)
    g, _ = ref_g(p)
    r = [sum(W[ids[i]][h] * g[i] for i in range(len(ids))) for h in range(H)]
    nr = math.sqrt(sum(v * v for v in r))
    cands = set(ref_top(S, cfg.R_k))
    U = {}
    if nr > cfg.eps_r:
        dt = [-v / nr for v in r]
        dirs = [ref_cos(dt, D[j]) for j in range(J)]
        cands |= set(ref_top(dirs, cfg.R_d))
    cands = sorted(cands)
    for j in cands:
        if nr > cfg.eps_r:
            Wd = [sum(W[ids[i]][h] * cfg.probe_eps * D[j][h] for h in range(H)) for i in range(len(ids))]
            U[j] = max(0.0, -sum(g[i] * Wd[i] for i in range(len(ids))))
        else:
            U[j] = 0.0
    # documented convention: a channel with weight 0 contributes 0 (not 0 * -inf = NaN)
    sc = [(cfg.lam_k * S[j] if cfg.lam_k else 0.0) + cfg.lam_u * U[j] for j in cands]
    sel = ref_top(sc, cfg.M)
    chosen = [cands[i] for i in sel]
    ex = [math.exp(sc[i] / cfg.T_agg) for i in sel]
    w = [v / sum(ex) for v in ex]
    agg = [sum(w[t] * D[chosen[t]][h] for t in range(len(chosen))) for h in range(H)]
    na = math.sqrt(sum(v * v for v in agg))
    d_bar = [v / (na + EPS) for v in agg]
    return chosen, w, d_bar, cands


def unit_rows(rng, n, H):
    X = rng.standard_normal((n, H))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


# ------------------------------------------------------------------ basics
def test_normalize_definition_and_zero_vector():
    v = np.array([3.0, 4.0])
    assert np.allclose(normalize(v), v / (5.0 + EPS))
    assert np.all(normalize(np.zeros(3)) == 0)
    M = np.array([[3.0, 4.0], [0.0, 2.0]])
    assert np.allclose(normalize(M), [[0.6, 0.8], [0.0, 1.0]], atol=1e-7)


def test_cosine_matrix_matches_loop():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((4, 5))
    ref = [[ref_cos(x, y) for y in b] for x in a]
    assert np.allclose(cosine_matrix(a, b), ref, atol=1e-12)


def test_top_indices_ties_and_nonfinite():
    s = [0.5, 0.9, 0.5, -np.inf, 0.9, np.nan]
    assert top_indices(s, 10).tolist() == [1, 4, 0, 2]
    assert top_indices(s, 3).tolist() == [1, 4, 0]
    assert top_indices(s, 0).tolist() == []


# ------------------------------------------------------------------- eq. 6
@pytest.mark.parametrize("K_v", [1, 2, 5, 16, 64, 500])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_restricted_probs_and_eq6_gradient_matches_finite_differences(K_v, seed):
    rng = np.random.default_rng(seed)
    V = 300
    logits = rng.standard_normal(V) * 3.0
    ids, p_hat = top_k_restricted(logits, K_v)
    ref_ids, ref_p = ref_restricted(list(logits), K_v)
    assert ids.tolist() == ref_ids
    assert np.allclose(p_hat, ref_p, rtol=1e-12, atol=1e-15)

    g, H_hat = restricted_entropy_grad(p_hat)
    z = logits[ids].astype(np.float64)
    assert H_hat == pytest.approx(ref_entropy_of_logits(z), abs=1e-12)
    fd = fd_grad(ref_entropy_of_logits, z)
    assert np.allclose(g, fd, atol=1e-8, rtol=1e-6)
    assert abs(g.sum()) < 1e-12  # entropy is shift-invariant in the logits


def test_top_k_restricted_ties_broken_by_lower_id_and_float32_input():
    logits = np.array([1.0, 3.0, 3.0, 2.0, 3.0], dtype=np.float32)
    ids, p = top_k_restricted(logits, 2)
    assert ids.tolist() == [1, 2]
    assert np.allclose(p, [0.5, 0.5])
    ids, _ = top_k_restricted(logits, 4)
    assert ids.tolist() == [1, 2, 4, 3]


def test_top_k_restricted_is_stable_for_huge_logits():
    logits = np.array([1000.0, 999.0, -1000.0, 998.0])
    ids, p = top_k_restricted(logits, 3)
    ref_ids, ref_p = ref_restricted(list(logits), 3)
    assert ids.tolist() == ref_ids and np.allclose(p, ref_p, rtol=1e-12)


def test_top_k_restricted_handles_masked_tokens():
    logits = np.array([0.0, -np.inf, 1.0, -np.inf])
    ids, p = top_k_restricted(logits, 3)
    assert ids.tolist() == [2, 0, 1]
    assert p[2] == 0
    g, H = restricted_entropy_grad(p)
    assert np.all(np.isfinite(g)) and g[2] == 0
    assert H == pytest.approx(ref_entropy_of_logits(np.array([1.0, 0.0])))
    with pytest.raises(ValueError):
        top_k_restricted(np.array([1.0, np.nan]), 1)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("pos", [0, 5000, 262143])
def test_top_k_restricted_rejects_nan_and_inf_on_the_native_path(bad, pos):
    """llama.cpp-sized float32 logits take the native pass, which must still refuse a NaN or
    +inf anywhere (the NaN test is fused into that pass)."""
    z = np.random.default_rng(pos).standard_normal(262144).astype(np.float32)
    ids, _ = top_k_restricted(z, 64)
    np.testing.assert_array_equal(ids, np.argsort(-z.astype(np.float64), kind="stable")[:64])
    z[pos] = bad
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        top_k_restricted(z, 64)


# ------------------------------------------------------------------- eq. 7
@pytest.mark.parametrize("K_v,H,seed", [(2, 3, 0), (8, 5, 1), (20, 16, 2), (64, 7, 3)])
def test_eq7_r_is_hidden_gradient_of_restricted_entropy(K_v, H, seed):
    rng = np.random.default_rng(seed)
    W_V = rng.standard_normal((K_v, H))
    h = rng.standard_normal(H)
    order, p_hat = top_k_restricted(W_V @ h, K_v)  # K_v == V: the full softmax, sorted
    g, _ = restricted_entropy_grad(p_hat)
    r, d = uncertainty_direction(W_V[order], g, eps_r=1e-9)

    fd = fd_grad(lambda x: ref_entropy_of_logits(W_V @ x), h)
    assert np.allclose(r, fd, atol=1e-8, rtol=1e-6)
    assert d is not None
    assert np.linalg.norm(d) == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(d, -fd / np.linalg.norm(fd), atol=1e-6)
    # steepest descent: no random unit direction decreases H faster
    dirs = unit_rows(rng, 200, H)
    assert np.all(dirs @ r >= d @ r - 1e-12)


def test_eq7_unavailable_below_eps_r():
    rng = np.random.default_rng(0)
    W_V = rng.standard_normal((4, 3))
    g, _ = restricted_entropy_grad(np.full(4, 0.25))  # uniform: dH/dz = 0
    r, d = uncertainty_direction(W_V, g, eps_r=1e-6)
    assert np.allclose(r, 0) and d is None
    g, _ = restricted_entropy_grad(np.array([0.7, 0.1, 0.1, 0.1]))
    r, d = uncertainty_direction(W_V, g, eps_r=1e-6)
    assert d is not None
    big = np.linalg.norm(r) * 1.0001
    assert uncertainty_direction(W_V, g, eps_r=big)[1] is None
    assert uncertainty_direction(W_V, g, eps_r=np.linalg.norm(r))[1] is None  # must *exceed*


# ------------------------------------------------------------------- eq. 9 (U)
def test_U_is_first_order_entropy_decrease_along_d():
    rng = np.random.default_rng(5)
    K, H, c = 12, 6, 10
    W_V = rng.standard_normal((K, H))
    h = rng.standard_normal(H)
    p = np.exp(W_V @ h - (W_V @ h).max())
    p /= p.sum()
    g, _ = restricted_entropy_grad(p)
    D = unit_rows(rng, c, H)
    eps = 1e-5
    U = uncertainty_utility(g, W_V, D, eps)
    for j in range(c):
        dec = -(ref_entropy_of_logits(W_V @ (h + eps * D[j])) - ref_entropy_of_logits(W_V @ (h - eps * D[j]))) / 2
        assert U[j] == pytest.approx(max(0.0, dec), abs=1e-12)
    assert (U > 0).any() and (U == 0).any()


# ------------------------------------------------------------- eqs. 8 - 10
@st.composite
def memories(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    J = draw(st.integers(1, 12))
    H = draw(st.integers(1, 6))
    A = draw(st.integers(0, 20))
    V = draw(st.integers(1, 30))
    cfg = RetrievalConfig(
        R_k=draw(st.integers(0, 10)),
        R_d=draw(st.integers(0, 10)),
        M=draw(st.integers(1, 6)),
        lam_k=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        lam_u=draw(st.sampled_from([0.0, 0.5, 3.0])),
        T_agg=draw(st.sampled_from([0.05, 0.2, 1.0])),
        K_v=draw(st.integers(1, 40)),
        eps_r=draw(st.sampled_from([0.0, 1e-6, 0.5])),
        probe_eps=draw(st.sampled_from([1e-2, 1.0])),
    )
    rng = np.random.default_rng(seed)
    return dict(
        k_q=rng.standard_normal(H),
        anchors=rng.standard_normal((A, H)),
        owner=rng.integers(0, J, size=A),
        D=unit_rows(rng, J, H),
        logits=rng.standard_normal(V) * 2,
        W=rng.standard_normal((V, H)),
        cfg=cfg,
    )


@settings(max_examples=150, deadline=None)
@given(memories())
def test_semantic_scores_match_loop(m):
    J = m["D"].shape[0]
    got = semantic_scores(m["k_q"], m["anchors"], m["owner"], J)
    ref = ref_semantic(m["k_q"], m["anchors"], m["owner"], J)
    for x, y in zip(got, ref):
        assert (x == y == -math.inf) or x == pytest.approx(y, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(memories(), st.booleans())
def test_candidate_set_matches_loop(m, with_dir):
    rng = np.random.default_rng(0)
    J = m["D"].shape[0]
    S = semantic_scores(m["k_q"], m["anchors"], m["owner"], J)
    dirs = rng.uniform(-1, 1, J) if with_dir else None
    cfg = m["cfg"]
    got = candidate_set(S, dirs, cfg.R_k, cfg.R_d).tolist()
    ref = set(ref_top(list(S), cfg.R_k))
    if with_dir:
        ref |= set(ref_top(list(dirs), cfg.R_d))
    assert got == sorted(ref)


@settings(max_examples=150, deadline=None)
@given(memories())
def test_U_score_selection_and_aggregation_match_loops(m):
    rng = np.random.default_rng(1)
    cfg = m["cfg"]
    D = m["D"]
    c, H = D.shape
    K = min(cfg.K_v, m["W"].shape[0])
    W_V = m["W"][:K]
    p = rng.dirichlet(np.ones(K))
    g, _ = restricted_entropy_grad(p)
    gr, _ = ref_g(list(p))

    U = uncertainty_utility(g, W_V, D, cfg.probe_eps)
    for j in range(c):
        Wd = [sum(W_V[i][h] * cfg.probe_eps * D[j][h] for h in range(H)) for i in range(K)]
        assert U[j] == pytest.approx(max(0.0, -sum(gr[i] * Wd[i] for i in range(K))), abs=1e-12)

    S = rng.uniform(-1, 1, c)
    sc = score(S, U, cfg.lam_k, cfg.lam_u)
    assert np.allclose(sc, [cfg.lam_k * S[j] + cfg.lam_u * U[j] for j in range(c)], atol=1e-15)

    order, w = select_and_weight(sc, cfg.M, cfg.T_agg)
    ref_order = ref_top(list(sc), cfg.M)
    assert order.tolist() == ref_order
    ex = [math.exp(sc[i] / cfg.T_agg) for i in ref_order]
    assert np.allclose(w, [v / sum(ex) for v in ex], rtol=1e-10)

    d = aggregate(D[order], w)
    agg = [sum(w[t] * D[ref_order[t]][h] for t in range(len(ref_order))) for h in range(H)]
    na = math.sqrt(sum(v * v for v in agg))
    assert np.allclose(d, [v / (na + EPS) for v in agg], atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(memories())
def test_full_pipeline_matches_plain_python(m):
    cfg = m["cfg"]
    W = m["W"]
    calls = []

    def rows(ids):
        calls.append(ids.copy())
        return W[ids].astype(np.float32)

    # the reference uses the float32-rounded head too
    W32 = W.astype(np.float32).astype(np.float64)
    res = retrieve(m["k_q"], m["anchors"], m["owner"], m["D"], m["logits"], rows, cfg)
    chosen, w, d_bar, cands = ref_pipeline(m["k_q"], m["anchors"], m["owner"], m["D"], m["logits"], W32, cfg)
    assert res.ids.tolist() == chosen
    assert res.candidates.tolist() == cands
    assert np.allclose(res.weights, w, rtol=1e-9, atol=1e-12)
    raw = sum(wi * m["D"][j] for wi, j in zip(w, chosen)) if chosen else np.zeros(1)
    if np.linalg.norm(raw) > 1e-6:  # Norm of a sum that cancels to ~eps amplifies rounding without bound
        assert np.allclose(res.d_bar, d_bar, atol=1e-9)
    assert len(calls) == 1 and calls[0].tolist() == ref_restricted(list(m["logits"]), cfg.K_v)[0]
    assert len(res) <= cfg.M


def test_anchorless_prototype_only_reachable_by_direction_and_never_selected():
    anchors = np.array([[1.0, 0, 0], [0, 1.0, 0]])
    S = semantic_scores(np.array([1.0, 0, 0]), anchors, np.array([0, 1]), 3)
    assert S[2] == -np.inf
    assert candidate_set(S, None, 8, 8).tolist() == [0, 1]
    assert candidate_set(S, np.array([0.0, 0.0, 1.0]), 8, 1).tolist() == [0, 1, 2]
    sc = score(S, np.zeros(3), 1.0, 0.5)
    order, w = select_and_weight(sc, 4, 0.2)
    assert order.tolist() == [0, 1] and np.isclose(w.sum(), 1)
    # lam_k = 0 drops the semantic channel instead of producing NaN
    assert np.all(np.isfinite(score(S, np.ones(3), 0.0, 0.5)))


def test_select_and_weight_empty_and_temperature():
    o, w = select_and_weight(np.array([-np.inf]), 4, 0.2)
    assert o.size == 0 and w.size == 0
    assert np.all(aggregate(np.zeros((0, 3)), np.zeros(0)) == 0)
    _, w_cold = select_and_weight(np.array([1.0, 0.9]), 2, 0.01)
    _, w_hot = select_and_weight(np.array([1.0, 0.9]), 2, 100.0)
    assert w_cold[0] > 0.99 and abs(w_hot[0] - 0.5) < 0.01
    with pytest.raises(ValueError):
        select_and_weight(np.array([1.0]), 1, 0.0)


# ------------------------------------------------------------------- eq. 11
def test_gate_matches_row_loop_and_clips_negative():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((50, 7))
    hq = rng.standard_normal(7)
    a = gate(h, hq)
    ref = [max(0.0, ref_cos(row, hq)) for row in h]
    assert np.allclose(a, ref, atol=1e-12)
    assert (a == 0).any() and (a > 0).any()
    assert gate(-hq, hq) == 0.0
    assert gate(2.5 * hq, hq) == pytest.approx(1.0, abs=1e-7)  # Norm eps
    assert isinstance(gate(h[0], hq), float)


# ------------------------------------------------------------------- modes
def _memory(seed=0, J=20, H=8, V=50):
    rng = np.random.default_rng(seed)
    D = unit_rows(rng, J, H)
    anchors = rng.standard_normal((2 * J, H))
    owner = np.arange(2 * J) % J
    W = rng.standard_normal((V, H)).astype(np.float32)
    logits = rng.standard_normal(V) * 2
    return rng.standard_normal(H), anchors, owner, D, logits, W


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("J", [1, 3, 20])
def test_every_mode_returns_at_most_M_ids_from_memory(mode, J):
    k_q, anchors, owner, D, logits, W = _memory(J=J)
    cfg = RetrievalConfig(M=4)
    res = retrieve(k_q, anchors, owner, D, logits, lambda ids: W[ids], cfg, mode,
                   rng=7, oracle_dir=D[0])
    assert 1 <= len(res) <= min(cfg.M, J)
    assert len(set(res.ids.tolist())) == len(res)
    assert all(0 <= j < J for j in res.ids)
    assert res.weights.sum() == pytest.approx(1.0)
    assert np.linalg.norm(res.d_bar) == pytest.approx(1.0, abs=1e-6)
    assert res.S_k.shape == res.U.shape == res.scores.shape == res.ids.shape


def test_oracle_ranks_matching_prototype_first():
    k_q, anchors, owner, D, logits, W = _memory()
    for j in (0, 7, 19):
        res = retrieve(k_q, anchors, owner, D, logits, None, RetrievalConfig(), "oracle", oracle_dir=3.0 * D[j])
        assert res.ids[0] == j
        assert res.scores[0] == pytest.approx(1.0, abs=1e-7)
        ref = sorted(range(20), key=lambda i: (-ref_cos(D[j], D[i]), i))[:4]
        assert res.ids.tolist() == ref
    with pytest.raises(ValueError):
        retrieve(k_q, anchors, owner, D, logits, None, RetrievalConfig(), "oracle")


def test_semantic_mode_ranks_by_best_anchor():
    k_q, anchors, owner, D, logits, W = _memory()
    res = retrieve(k_q, anchors, owner, D, logits, None, RetrievalConfig(), "semantic")
    S = ref_semantic(k_q, anchors, owner, 20)
    assert res.ids.tolist() == ref_top(S, 4)
    assert np.allclose(res.scores, [S[j] for j in res.ids])


def test_uncertainty_mode_ranks_by_direction_and_is_empty_without_it():
    k_q, anchors, owner, D, logits, W = _memory()
    cfg = RetrievalConfig()
    res = retrieve(k_q, anchors, owner, D, logits, lambda ids: W[ids], cfg, "uncertainty")
    ids, p = ref_restricted(list(logits), cfg.K_v)
    g, _ = ref_g(p)
    r = W[ids].astype(np.float64).T @ np.array(g)
    cos = [ref_cos(-r, D[j]) for j in range(20)]
    assert res.ids.tolist() == ref_top(cos, 4)
    assert res.has_dir and np.all(res.U >= 0)
    flat = np.zeros_like(logits)  # uniform p_hat -> r = 0 -> no direction
    res = retrieve(k_q, anchors, owner, D, flat, lambda ids: W[ids], cfg, "uncertainty")
    assert len(res) == 0 and not res.has_dir and np.all(res.d_bar == 0)
    # sem+unc without a direction falls back to semantic candidates with U = 0
    res = retrieve(k_q, anchors, owner, D, flat, lambda ids: W[ids], cfg, "sem+unc")
    assert res.candidates.tolist() == sorted(ref_top(ref_semantic(k_q, anchors, owner, 20), 8))
    assert np.all(res.U == 0)


@pytest.mark.parametrize("mode", ["semantic", "uncertainty", "sem+unc", "oracle"])
def test_float32_memory_gives_same_selection(mode):
    k_q, anchors, owner, D, logits, W = _memory(seed=4)
    cfg = RetrievalConfig()
    # not D[3] + D[5]: that is an exact tie, which float32 and float64 may break either way
    # (it did on an AVX2 CPU); this test is about selections, not about ties across precisions
    od = D[3] + 0.8 * D[5]
    a = retrieve(k_q, anchors, owner, D, logits, lambda ids: W[ids], cfg, mode, oracle_dir=od)
    b = retrieve(k_q.astype(np.float32), anchors.astype(np.float32), owner, D.astype(np.float32),
                 logits.astype(np.float32), lambda ids: W[ids], cfg, mode, oracle_dir=od)
    assert a.ids.tolist() == b.ids.tolist()
    assert np.allclose(a.d_bar, b.d_bar, atol=1e-5)


def test_random_mode_is_seeded_and_uniform():
    k_q, anchors, owner, D, logits, W = _memory()
    cfg = RetrievalConfig(M=4)
    a = retrieve(k_q, anchors, owner, D, logits, None, cfg, "random", rng=11)
    b = retrieve(k_q, anchors, owner, D, logits, None, cfg, "random", rng=11)
    assert a.ids.tolist() == b.ids.tolist()
    assert np.allclose(a.weights, 0.25)
    counts = np.zeros(20)
    gen = np.random.default_rng(0)
    for _ in range(2000):
        counts[retrieve(k_q, anchors, owner, D, logits, None, cfg, "random", rng=gen).ids] += 1
    assert counts.min() > 300 and counts.max() < 500  # expectation 400 each


def test_empty_memory_and_bad_arguments():
    res = retrieve(np.ones(3), np.zeros((0, 3)), np.zeros(0, dtype=int), np.zeros((0, 3)),
                   np.ones(5), None, RetrievalConfig(), "sem+unc")
    assert len(res) == 0 and res.d_bar.shape == (3,)
    k_q, anchors, owner, D, logits, W = _memory()
    with pytest.raises(InputError, match="unknown retrieval mode"):
        retrieve(k_q, anchors, owner, D, logits, None, RetrievalConfig(), "best")
    with pytest.raises(ValueError, match="W_rows_fn"):
        retrieve(k_q, anchors, owner, D, logits, lambda ids: W[ids][:, :3], RetrievalConfig(), "sem+unc")
    with pytest.raises(ValueError, match="anchor_owner"):
        semantic_scores(k_q, anchors, owner + 20, 20)


@pytest.mark.parametrize("kw", [dict(M=0), dict(R_k=-1), dict(T_agg=0.0), dict(lam_u=-1.0),
                                dict(K_v=0), dict(probe_eps=float("nan")), dict(M=2.5)])
def test_config_validation(kw):
    with pytest.raises(InputError, match=next(iter(kw))):
        RetrievalConfig(**kw)


def test_paper_defaults():
    c = RetrievalConfig()
    assert (c.R_k, c.R_d, c.M, c.lam_k, c.lam_u, c.T_agg) == (8, 8, 4, 1.0, 0.5, 0.2)


# ------------------------------------------------------------ oracle alignment
def test_oracle_alignment_is_mean_cosine():
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    a[2] = 0  # a query without retrieval counts as 0
    ref = sum(ref_cos(x, y) for x, y in zip(a, b)) / 6
    assert oracle_alignment(a, b) == pytest.approx(ref, abs=1e-12)
    assert oracle_alignment(b[0], 2 * b[0]) == pytest.approx(1.0, abs=1e-7)
    with pytest.raises(ValueError):
        oracle_alignment(a, b[:3])


# ------------------------------------------------------------------- the serving path's ScanIndex
@settings(max_examples=150, deadline=None)
@given(memories())
def test_scan_index_scores_match_plain_python(m):
    """Prepared unit rows + reduceat give the loops' S_k and cos(v, d_j) to float32 precision;
    owners come unsorted and some prototypes own no anchor (-inf)."""
    J = m["D"].shape[0]
    idx = ScanIndex.build(m["anchors"], m["owner"], m["D"])
    got = idx.semantic(m["k_q"])
    ref = ref_semantic(m["k_q"], m["anchors"], m["owner"], J)
    for x, y in zip(got, ref):
        assert (x == y == -math.inf) or x == pytest.approx(y, abs=1e-5)
    v = m["W"][0]
    np.testing.assert_allclose(idx.dir_cos(v), [ref_cos(v, d) for d in m["D"]], atol=1e-5)


def _well_separated(values, gap=1e-4) -> bool:
    v = np.sort(np.asarray([x for x in values if np.isfinite(x)]))
    return v.size < 2 or bool(np.min(np.diff(v)) > gap)


@pytest.mark.parametrize("shadow", [False, True])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(m=memories())
def test_full_pipeline_with_scan_index_matches_plain_python(shadow, m):
    """Prepared float32 rows (shadow off) and the bounded int8 scan (shadow forced on: it re-scores
    every row that could be in Top_R) both give the plain-Python pipeline's selection."""
    cfg = m["cfg"]
    W = m["W"]
    W32 = W.astype(np.float32).astype(np.float64)
    # float32 cosines cannot order scores closer than their rounding: such draws are skipped
    J = m["D"].shape[0]
    assume(_well_separated(ref_semantic(m["k_q"], m["anchors"], m["owner"], J)))
    ids, p = ref_restricted(list(m["logits"]), cfg.K_v)
    g, _ = ref_g(p)
    r = W32[ids].T @ np.array(g)
    assume(_well_separated([ref_cos(-r, d) for d in m["D"]]))
    idx = ScanIndex.build(m["anchors"], m["owner"], m["D"], shadow=shadow)
    res = retrieve(m["k_q"], m["anchors"], m["owner"], m["D"], m["logits"], lambda ids: W[ids].astype(np.float32),
                   cfg, index=idx)
    chosen, w, d_bar, cands = ref_pipeline(m["k_q"], m["anchors"], m["owner"], m["D"], m["logits"], W32, cfg)
    assert res.ids.tolist() == chosen
    assert res.candidates.tolist() == cands
    np.testing.assert_allclose(res.weights, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res.d_bar, d_bar, atol=1e-4)


def test_scan_index_refuses_a_mismatched_memory():
    k_q, anchors, owner, D, logits, W = _memory()
    idx = ScanIndex.build(anchors, owner, D)
    with pytest.raises(ValueError, match="index"):
        retrieve(k_q, anchors, owner, D[:10], logits, lambda ids: W[ids], RetrievalConfig(), index=idx)
    with pytest.raises(ValueError, match="anchor_owner"):
        ScanIndex.build(anchors, owner + 100, D)


@pytest.mark.parametrize("H", [64, 640])
@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("mode", ["sem+unc", "semantic", "uncertainty", "oracle"])
def test_int8_shadow_matches_the_float_scan_on_large_memories(clustered, mode, H):
    """H = 640 puts > 1 MiB of int8 rows in each scan: the scans are split over threads, and
    sem+unc runs the anchor and direction scans concurrently (i8_recall_pair); there every
    prototype has one anchor (or none), the exact re-score's one-row path."""
    rng = np.random.default_rng(5)
    J, V = 3000, 200
    if clustered:  # near-duplicates: many rows inside each other's error bounds
        centers = rng.standard_normal((30, H))
        anchors = centers[rng.integers(0, 30, 2 * J)] + 0.01 * rng.standard_normal((2 * J, H))
        D = centers[rng.integers(0, 30, J)] + 0.01 * rng.standard_normal((J, H))
    else:
        anchors, D = rng.standard_normal((2 * J, H)), rng.standard_normal((J, H))
    D = D / np.linalg.norm(D, axis=1, keepdims=True)
    owner = rng.permutation(np.arange(2 * J) % (J - 7))  # unsorted, 7 prototypes without anchors
    if H == 640:  # one anchor per prototype (a fresh memory): the exact re-score's one-row path
        anchors, owner = anchors[: J - 7], rng.permutation(J - 7)
    W = rng.standard_normal((V, H)).astype(np.float32)
    cfg = RetrievalConfig()
    full = ScanIndex.build(anchors, owner, D, shadow=False)
    fast = ScanIndex.build(anchors, owner, D)
    assert fast.shadow is not None and full.shadow is None
    assert fast.one_row_segments == (H == 640)
    for q in range(20):
        k_q, logits = rng.standard_normal(H), 3 * rng.standard_normal(V)
        od = D[q] + 0.1 * rng.standard_normal(H)
        a = retrieve(k_q, anchors, owner, D, logits, lambda i: W[i], cfg, mode, index=full, oracle_dir=od)
        b = retrieve(k_q, anchors, owner, D, logits, lambda i: W[i], cfg, mode, index=fast, oracle_dir=od)
        assert a.ids.tolist() == b.ids.tolist()
        assert a.candidates.tolist() == b.candidates.tolist()
        np.testing.assert_allclose(a.weights, b.weights, rtol=1e-5)
        np.testing.assert_allclose(a.S_k, b.S_k, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_native_top_k_path_equals_the_numpy_path(seed):
    """float32 logits of a real vocabulary size take the native heap; float64 the partition."""
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal(262144) * 3).astype(np.float32)
    z[rng.integers(0, z.size, 50)] = z.max()  # ties at the top, broken by the lower id
    z[rng.integers(0, z.size, 500)] = -np.inf
    for k in (1, 64, 1000):
        a_ids, a_p = top_k_restricted(z, k)
        b_ids, b_p = top_k_restricted(z.astype(np.float64), k)
        assert a_ids.tolist() == b_ids.tolist()
        np.testing.assert_array_equal(a_p, b_p)
        assert a_ids.tolist() == np.lexsort((np.arange(z.size), -z.astype(np.float64)))[:k].tolist()
