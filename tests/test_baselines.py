"""The outside baselines (``miita_edge.evaluation.baselines``): semantic-mem and knn-lm.

Pure parts against brute-force numpy re-derivations; the model tier checks the teacher-forced
hidden states against separate decodes, the byte accounting against the saved arrays, and that
the budgeted datastore is exactly the top-priority subset of the unbudgeted one.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from miita_edge.evaluation import baselines as bl
from miita_edge import evaluation as ev
from miita_edge.errors import BudgetError

BANKING = Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77"


# --------------------------------------------------------------------------- kNN-LM math
def _knn_ref(h, keys, values, k):
    d = np.array([float(np.dot(h - r, h - r)) for r in keys.astype(np.float64)])
    order = sorted(range(len(d)), key=lambda i: (d[i], i))[:k]
    tau = np.mean([d[i] for i in order])
    dmin = min(d[i] for i in order)
    w = {i: np.exp(-(d[i] - dmin) / tau) for i in order}
    Z = sum(w.values())
    p = {}
    for i in order:
        p[int(values[i])] = p.get(int(values[i]), 0.0) + w[i] / Z
    return p


@pytest.mark.parametrize("seed", range(5))
def test_knn_distribution_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(40, 16)).astype(np.float32)
    keys[7] = keys[3]  # a distance tie: the older entry first
    values = rng.integers(0, 6, size=40)
    h = rng.normal(size=16)
    got = bl.knn_distribution(h, keys, values, 8)
    ref = _knn_ref(h, keys, values, 8)
    assert got.keys() == ref.keys()
    for v in ref:
        assert got[v] == pytest.approx(ref[v], rel=1e-9)
    assert sum(got.values()) == pytest.approx(1.0)


def test_knn_weights_do_not_depend_on_the_hidden_scale():
    rng = np.random.default_rng(1)
    keys, values, h = rng.normal(size=(20, 8)), rng.integers(0, 5, size=20), rng.normal(size=8)
    a = bl.knn_distribution(h, keys, values, 6)
    b = bl.knn_distribution(100 * h, 100 * keys, values, 6)
    assert a.keys() == b.keys() and all(a[v] == pytest.approx(b[v]) for v in a)


def test_knn_lm_mix_is_the_interpolation():
    rng = np.random.default_rng(2)
    V, H = 50, 8
    logits = rng.normal(size=V).astype(np.float32)
    keys, values, h = rng.normal(size=(12, H)), rng.integers(0, V, size=12), rng.normal(size=H)
    p = bl.knn_lm_mix(logits, h, keys, values, 4, 0.25)
    p_lm = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    p_knn = np.zeros(V)
    for v, pv in _knn_ref(h, keys, values, 4).items():
        p_knn[v] += pv
    np.testing.assert_allclose(p, 0.25 * p_knn + 0.75 * p_lm, rtol=1e-6, atol=1e-12)
    assert p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(bl.knn_lm_mix(logits, h, keys[:0], values[:0], 4, 0.25), p_lm, rtol=1e-6)


def test_priority_is_a_length_prefixed_hash_and_roughly_uniform():
    ref = int.from_bytes(hashlib.sha256((2).to_bytes(8, "little") + b"ab" + (1).to_bytes(8, "little") + b"c")
                         .digest()[:8], "little") / 2.0 ** 64
    assert bl.priority("ab", "c") == ref
    assert bl.priority("ab", "c") != bl.priority("a", "bc")  # the length prefix separates fields
    draws = np.array([bl.priority(str(i)) for i in range(4000)])
    assert 0 <= draws.min() and draws.max() < 1
    hist = np.histogram(draws, bins=10, range=(0, 1))[0]
    assert hist.min() > 300 and hist.max() < 500  # 400 expected per bin; 5 sigma is ±100


# --------------------------------------------------------------------------- semantic-mem math
def _sem(budget, H=6):
    m = bl.SemanticMem()
    m.ctx = SimpleNamespace(engine=SimpleNamespace(n_embd=H), budget_bytes=budget)
    m.reset()
    return m


def _unit(v):
    return v / np.linalg.norm(v)


def test_semantic_write_merges_above_tau_k_with_running_means():
    m = _sem(None)
    k1, s1 = np.array([1, 0, 0, 0, 0, 0.0]), _unit(np.array([0, 1, 0, 0, 0, 0.0]))
    k2 = np.array([1, 0.3, 0, 0, 0, 0.0])  # cos(k1, k2) = 0.958 >= 0.80: merged
    s2 = _unit(np.array([0, 0, 1, 0, 0, 0.0]))
    k3 = np.array([0, 0, 0, 1, 0, 0.0])  # orthogonal: new prototype
    for k, s in ((k1, s1), (k2, s2), (k3, s1)):
        m._write(k, s)
    assert len(m.K) == 2 and list(m.n) == [2, 1]
    np.testing.assert_allclose(m.K[0], (k1 + k2) / 2, rtol=1e-6)
    np.testing.assert_allclose(m.S[0], _unit((s1 + s2) / 2), rtol=1e-6)
    assert m.memory_bytes() == 2 * (2 * 4 * 6 + 4)


def test_semantic_repair_merges_the_most_similar_pair_then_refuses():
    H = 6
    per = 2 * 4 * H + 4
    m = _sem(2 * per)
    rng = np.random.default_rng(0)
    ks = [np.eye(H)[0], np.eye(H)[1], _unit(np.eye(H)[1] + 0.9 * np.eye(H)[2])]  # 2nd and 3rd closest (0.74)
    ss = [_unit(rng.normal(size=H)) for _ in ks]
    for k, s in zip(ks, ss):
        m._write(k, s)
        m._repair()
    assert len(m.K) == 2 and list(m.n) == [1, 2]
    np.testing.assert_allclose(m.K[1], (ks[1] + ks[2]) / 2, rtol=1e-6)
    np.testing.assert_allclose(m.S[1], _unit(ss[1] + ss[2]), rtol=1e-6)
    tiny = _sem(per - 1)
    tiny._write(ks[0], ss[0])
    with pytest.raises(BudgetError, match="one prototype takes"):
        tiny._repair()


def test_semantic_retrieve_is_top_m_softmax_over_cosines():
    m = _sem(None, H=4)
    rng = np.random.default_rng(3)
    m.K = rng.normal(size=(7, 4)).astype(np.float32)
    m.S = rng.normal(size=(7, 4)).astype(np.float32)
    m.n = np.ones(7, np.int32)
    q = rng.normal(size=4)
    ids, w = m.retrieve(q)
    cos = np.array([_unit(k.astype(np.float64)) @ _unit(q) for k in m.K])
    ref = np.argsort(-cos, kind="stable")[:4]
    assert list(ids) == list(ref)
    e = np.exp((cos[ref] - cos[ref].max()) / 0.2)
    np.testing.assert_allclose(w, e / e.sum(), rtol=1e-9)


# --------------------------------------------------------------------------- with the model
@pytest.mark.model
def test_target_states_are_the_states_of_separate_decodes(engine1):
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.method.templates import get_template

    tpl = get_template("banking77")
    x, y = "I still have not received my new card", "card_arrival"
    ts = bl.target_states(engine1, tpl, x, y, skip_bos=True, max_prompt_tokens=None)
    prompt = prompt_tokens(engine1, tpl, x)
    assert ts.target == engine1.tokenize(tpl.render_target(y), add_bos=False)
    assert ts.hidden.shape == (len(ts.target), engine1.n_embd)
    for t in range(len(ts.target)):  # row t predicts y_{t+1}: the last row of prompt + y_1..y_t
        h = engine1.query(prompt + ts.target[:t]).h_q
        cos = float(h @ ts.hidden[t] / np.linalg.norm(h) / np.linalg.norm(ts.hidden[t]))
        assert cos > 0.999, (t, cos)  # batch vs one-by-one decoding rounds differently
    st = engine1.query(prompt, skip_bos_in_key=True)
    # the same rows in a batch of another size: llama.cpp's kernels round differently by batch
    # shape (on an AVX2 CPU up to 0.045 on components of a key of norm ~6,700), so compare
    # against the key's norm, not per component
    err = np.linalg.norm(ts.key - st.key) / np.linalg.norm(st.key)
    assert err < 1e-4, err


def _arrays_bytes(snap: Path) -> int:
    return sum(np.load(f).nbytes for f in sorted(snap.glob("*.npy")))


@pytest.mark.model
@pytest.mark.parametrize("method", ["knn-lm", "semantic-mem"])
def test_budget_accounting_is_the_saved_arrays(method, engine1, tmp_path):
    budget = 6000
    res = ev.run_benchmark("banking77", BANKING, method, tmp_path / method, budget=str(budget), stages="1,2",
                           limit_per_stage=1, limit_train_per_stage=4, max_tokens=4, progress=False,
                           engine=engine1, baseline=None)
    for t, r in enumerate(res["per_stage"]):
        snap = tmp_path / method / "state" / f"stage-{t:02d}"
        assert r["memory_bytes_after"] == _arrays_bytes(snap) <= budget
        assert r["memory_bytes_after"] > 0


@pytest.mark.model
def test_knn_budget_keeps_the_top_priority_entries_of_the_stream(engine1, tmp_path):
    kw = dict(stages="1,2", limit_per_stage=1, limit_train_per_stage=3, max_tokens=2, progress=False,
              engine=engine1, baseline=None)
    ev.run_benchmark("banking77", BANKING, "knn-lm", tmp_path / "all", budget="none", **kw)
    budget = 5 * 648 + 100
    ev.run_benchmark("banking77", BANKING, "knn-lm", tmp_path / "cut", budget=str(budget), **kw)
    full = [np.load(tmp_path / "all" / "state" / "stage-01" / f) for f in ("keys.npy", "values.npy")]
    cut = [np.load(tmp_path / "cut" / "state" / "stage-01" / f) for f in ("keys.npy", "values.npy")]
    assert len(full[0]) > 5 and len(cut[0]) == 5
    prio = [int.from_bytes(hashlib.sha256(len(q.tobytes()).to_bytes(8, "little") + q.tobytes()
                                          + (4).to_bytes(8, "little") + int(v).to_bytes(4, "little", signed=True))
                           .digest()[:8], "little") for q, v in zip(*full)]
    top = sorted(sorted(range(len(prio)), key=lambda i: -prio[i])[:5])
    np.testing.assert_array_equal(cut[0], full[0][top])
    np.testing.assert_array_equal(cut[1], full[1][top])


@pytest.mark.model
def test_knn_budget_below_one_entry_is_a_budget_error(engine1, tmp_path):
    with pytest.raises(BudgetError, match="one entry takes 648 bytes"):
        ev.run_benchmark("banking77", BANKING, "knn-lm", tmp_path / "o", budget="600", stages="1",
                         limit_per_stage=1, limit_train_per_stage=2, max_tokens=2, progress=False, engine=engine1,
                         baseline=None)



@pytest.mark.model
def test_semantic_mem_keys_are_centred_as_the_paper_preset_centres(engine1, tmp_path):
    """The stored prototypes are semantic-mem's writes of the examples' keys minus the calibration
    mean, replayed here from separate decodes (a query per calibration input and per training
    prompt), so the centring vector, the layer and what is written are all checked."""
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.method.calibration import CALIBRATION_INPUTS
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.method.templates import get_template

    mid = engine1.n_layer // 2
    engine1.set_key_layers([mid - 2])  # left on another layer: the method must pool from its own
    try:
        res = ev.run_benchmark("banking77", BANKING, "semantic-mem", tmp_path / "sem", budget="none",
                               stages="1,2", limit_per_stage=1, limit_train_per_stage=5, max_tokens=2,
                               progress=False, engine=engine1, baseline=None)
        assert res["method_settings"] == {"preset": "semantic-mem", "version": 2}
        assert list(engine1.key_layers) == [mid]
        tpl = get_template("banking77")
        key = lambda x: engine1.query(prompt_tokens(engine1, tpl, x), skip_bos_in_key=True).key.astype(np.float64)
        mu = np.mean([key(x) for x in CALIBRATION_INPUTS], axis=0)
        _, stages = load_benchmark(get_benchmark("banking77"), BANKING, "1,2", 1, 5)
        ref = _sem(None, H=engine1.n_embd)
        for ex in (e for st in stages for e in st.train):
            ref._write(key(ex.input) - mu, np.eye(engine1.n_embd)[0])
        snap = tmp_path / "sem" / "state" / "stage-01"
        K, n = np.load(snap / "keys.npy"), np.load(snap / "counts.npy")
        assert list(n) == list(ref.n) and int(n.sum()) == 10
        assert len(n) > 1  # uncentred, all ten keys lie within cosine 0.80: one prototype
        # a key pooled from the prompt + answer batch and from the prompt alone rounds differently
        # (test_target_states_…: 1e-4 of the raw key's norm); centring keeps that error and makes
        # the keys ~20x shorter, so it is bounded against the raw scale: 4.4e-4 of it on an AVX-512
        # CPU, whose kernels round the two batch shapes further apart than AVX2's. A centring vector,
        # layer or write that is wrong misses by the order of the key itself (~5e-2 of the raw scale)
        err = np.linalg.norm(K - ref.K, axis=1).max()
        assert err < 1e-3 * np.linalg.norm(mu), (err, np.linalg.norm(mu))
    finally:
        engine1.set_key_layers([mid])
