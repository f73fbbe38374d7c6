"""Real-model tier for the engine and its eval callback.

Every check compares what llama.cpp computed with our callback installed
against an independent numpy reference.
"""
from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.model

PROMPT = "Classify the banking customer query into an intent.\nQuery: my card has not arrived yet\nIntent:"


def q8_0_roundtrip(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0 then dequantize: blocks of 32, d = amax/127 stored as fp16."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.trunc(b * inv + np.copysign(0.5, b * inv))  # roundf: half away from zero
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def unit(rng, n):
    v = rng.standard_normal(n).astype(np.float32)
    return v / np.linalg.norm(v)


def test_logit_shift_equals_W_delta_up_to_q8_rounding(engine, W_ref):
    rng = np.random.default_rng(0)
    toks = engine.tokenize(PROMPT)
    state = engine.query(toks)
    h = state.h_q
    d = unit(rng, engine.n_embd)
    eta = 8.0
    # re-decode the last token with an ungated addition
    engine.truncate(len(toks) - 1)
    engine.native.set_capture(True, 1)
    engine.set_steer(d, state.h_q, eta, "ungated")
    steered = engine.decode([toks[-1]], "last")[0]
    h_again = engine.native.captured()[0]
    engine.set_steer(None, None, 0.0, "off")
    engine.native.set_capture(False, 0)
    np.testing.assert_allclose(h_again, h, rtol=0, atol=1e-4)  # capture is pre-steer and deterministic

    shift = steered - state.logits
    plain = W_ref @ (eta * d)
    ref = W_ref @ q8_0_roundtrip(h + eta * d) - W_ref @ q8_0_roundtrip(h)
    err = np.abs(shift - ref).max()
    assert err < 2e-3 * np.abs(ref).max() + 1e-3, err
    cos = shift @ plain / np.linalg.norm(shift) / np.linalg.norm(plain)
    assert cos > 0.99, cos


def test_gate_matches_numpy_cosine_per_row(engine, W_ref):
    rng = np.random.default_rng(1)
    toks = engine.tokenize(PROMPT)
    state = engine.query(toks)
    d = unit(rng, engine.n_embd)
    eta = 6.0
    more = engine.tokenize(" card arrival and some more words", add_bos=False)
    engine.native.set_capture(True, len(more))
    engine.native.alpha_clear()
    engine.set_steer(d, state.h_q, eta, "gated")
    n0 = engine.n_past
    steered = engine.decode(more, "all")
    rows = engine.native.captured()
    alphas = engine.native.alphas()
    engine.set_steer(None, None, 0.0, "off")
    engine.native.set_capture(False, 0)
    cos = rows @ state.h_q / np.linalg.norm(rows, axis=1) / np.linalg.norm(state.h_q)
    np.testing.assert_allclose(alphas, np.maximum(0.0, cos), atol=1e-5)
    # the logits of every row moved by alpha_i * eta * W d (up to Q8_0 rounding)
    engine.truncate(n0)
    plain = engine.decode(more, "all")
    shift = steered - plain
    ref = np.stack([W_ref @ (q8_0_roundtrip(r + a * eta * d) - q8_0_roundtrip(r)) for r, a in zip(rows, alphas)])
    assert np.abs(shift - ref).max() < 2e-3 * np.abs(ref).max() + 1e-3


@pytest.mark.parametrize("mode", ["ungated", "off"])
def test_ungated_and_off_modes(engine, mode):
    rng = np.random.default_rng(2)
    toks = engine.tokenize(PROMPT)
    state = engine.query(toks)
    d = unit(rng, engine.n_embd)
    engine.truncate(len(toks) - 1)
    engine.native.alpha_clear()
    engine.set_steer(d, state.h_q, 5.0, mode)
    out = engine.decode([toks[-1]], "last")[0]
    alphas = engine.native.alphas()
    engine.set_steer(None, None, 0.0, "off")
    if mode == "off":
        assert len(alphas) == 0
        np.testing.assert_array_equal(out, state.logits)
    else:
        np.testing.assert_array_equal(alphas, [1.0])
        assert np.abs(out - state.logits).max() > 0.5


def _reference_layer_rows(model_path, tokens, layer):
    """l_out-<layer> rows through a plain llama-cpp-python context with a *Python* ctypes
    callback: slow but independent of our native code.

    The weights are loaded the way the engine loads them (repacked "extra buffer" kernels on
    CPUs without AMX, plain ones with AMX): the two layouts run different matmul kernels whose
    activations differ by ~0.2% (measured on an AMD EPYC), which is as large as the error this
    test must detect (leaving out one prompt row moves the mean by 0.7-1.2%)."""
    import llama_cpp as L
    from miita_edge.runtime.engine import cpu_has_amx

    rows = []
    name = f"l_out-{layer}".encode()

    class Tensor(ctypes.Structure):  # only the fields we read, per ggml.h
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                    ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                    ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, ud):
        tt = ctypes.cast(t, ctypes.POINTER(Tensor)).contents
        if tt.name != name:
            return False if ask else True
        if ask:
            return True
        n = tt.ne[0] * tt.ne[1]
        arr = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float)), shape=(n,))
        rows.append(arr.reshape(tt.ne[1], tt.ne[0]).copy())
        return True

    mp = L.llama_model_default_params()
    mp.use_extra_bufts = not cpu_has_amx()  # as EngineConfig(use_extra_bufts=None) decides
    model = L.llama_model_load_from_file(str(model_path).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(512, 0, 1)
    for i, tok in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, 0
        batch.seq_id[i][0] = 0
    batch.logits[len(tokens) - 1] = 1
    batch.n_tokens = len(tokens)
    assert L.llama_decode(ctx, batch) == 0
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return np.concatenate(rows)


@pytest.fixture
def own_engine(model_path):
    """An engine of the session engine's configuration that no other test has touched (the session
    engine's key layers, prefix cache and KV state move with the tests run before)."""
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(model_path, EngineConfig(n_ctx=1024, n_batch=256))
    yield eng
    eng.close()


def test_key_is_mean_of_layer_rows_in_any_batching(own_engine, model_path):
    from miita_edge.runtime.engine import Engine, EngineConfig

    engine = own_engine
    toks = engine.tokenize(PROMPT)
    ref_rows = _reference_layer_rows(model_path, toks, engine.key_layer)
    assert ref_rows.shape == (len(toks), engine.n_embd)
    ref_all = ref_rows.mean(axis=0)
    ref_nobos = ref_rows[1:].mean(axis=0)

    # one ubatch (key includes every row)
    engine.reset()
    engine.decode(toks, "last", key_mask=[True] * len(toks))
    s, n = engine.native.key()
    assert n == len(toks)
    np.testing.assert_allclose(s / n, ref_all, rtol=1e-4, atol=1e-3 * np.abs(ref_all).max())
    # query(): BOS row excluded
    q = engine.query(toks)
    assert q.key_rows == len(toks) - 1
    np.testing.assert_allclose(q.key, ref_nobos, rtol=1e-4, atol=1e-3 * np.abs(ref_nobos).max())
    # token by token through the same engine (separate decode calls)
    engine.reset()
    for t in toks:
        engine.decode([t], "last", key_mask=[True])
    s, n = engine.native.key()
    np.testing.assert_allclose(s / n, ref_all, rtol=1e-4, atol=1e-3 * np.abs(ref_all).max())
    # several ubatches in one decode call (n_batch = 4)
    # (the reference's layer: the session engine's first key layer, whatever earlier tests set)
    with Engine(model_path, EngineConfig(n_ctx=256, n_batch=4, key_layer=engine.key_layer)) as small:
        q2 = small.query(toks)
        np.testing.assert_allclose(q2.key, ref_nobos, rtol=1e-4, atol=1e-3 * np.abs(ref_nobos).max())


def test_several_key_layers_are_each_layers_mean_in_one_pass(model_path):
    """One prompt pass watching l_out-12, l_out-9 and l_out-3 gives each layer's BOS-less row mean,
    against a reference decode per layer (a Python callback) and in the order asked for; the
    concatenation is the key, and a key of one layer again is that layer's alone."""
    from miita_edge.runtime.engine import Engine, EngineConfig

    with Engine(model_path, EngineConfig(n_ctx=256)) as eng:
        toks = eng.tokenize(PROMPT)
        eng.set_key_layers([12, 9, 3])
        q = eng.query(toks)
        assert q.key.shape == (3 * eng.n_embd,) and q.keys.shape == (3, eng.n_embd)
        refs = [_reference_layer_rows(model_path, toks, layer)[1:].mean(axis=0) for layer in (12, 9, 3)]
        for block, ref in zip(q.keys, refs):
            np.testing.assert_allclose(block, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())
    # several ubatches per decode: each layer's sum carries across them (llama.cpp's kernels round
    # a 4-row batch differently, so within 1% of the norm rather than elementwise)
    with Engine(model_path, EngineConfig(n_ctx=256, n_batch=4)) as eng:
        eng.set_key_layers([12, 9, 3])
        q4 = eng.query(toks)
        for block, ref in zip(q4.keys, refs):
            assert np.linalg.norm(block - ref) <= 1e-2 * np.linalg.norm(ref)
        eng.set_key_layers([9])
        q9 = eng.query(toks)
        assert q9.key.shape == (eng.n_embd,)
        np.testing.assert_array_equal(q9.key, q4.keys[1])
        with pytest.raises(ValueError):
            eng.set_key_layers([9, 9])
        with pytest.raises(Exception, match="out of range"):
            eng.set_key_layers([eng.n_layer - 1])


def test_exact_correction_matches_dense_numpy(engine, W_ref):
    toks = engine.tokenize(PROMPT)
    target = engine.tokenize(" card arrival\n", add_bos=False)
    engine.reset()
    flags = [False] * (len(toks) - 1) + [True] * len(target) + [False]
    logits = engine.decode(toks + target, flags)[: len(target)]
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    W64 = W_ref.astype(np.float64)
    per_pos_ref = W64[target] - p @ W64
    R_ref = per_pos_ref.mean(axis=0)
    lm = engine.lm_head
    # float32 accumulation over 262144 rows: allow 1e-3 of the largest component
    R = lm.correction(logits, target)
    np.testing.assert_allclose(R, R_ref, rtol=0, atol=1e-3 * np.abs(R_ref).max())
    assert R @ R_ref / np.linalg.norm(R) / np.linalg.norm(R_ref) > 0.99999
    per_pos = lm.correction(logits, target, per_position=True)
    np.testing.assert_allclose(per_pos, per_pos_ref, rtol=0, atol=1e-3 * np.abs(per_pos_ref).max())
    cos = []
    for k in (64, 256, 1024, 4096):
        Rk = lm.correction(logits, target, top_k=k)
        cos.append(Rk @ R_ref / np.linalg.norm(Rk) / np.linalg.norm(R_ref))
        # top-k equals the same sum restricted to the k most probable rows (brute force)
        ref_k = np.zeros_like(R_ref)
        for t in range(len(target)):
            top = np.argsort(-z[t], kind="stable")[:k]
            ref_k += (W64[target[t]] - p[t, top] @ W64[top]) / len(target)
        np.testing.assert_allclose(Rk, ref_k, rtol=0, atol=1e-3 * np.abs(ref_k).max())
    assert cos[2] >= 0.999, cos
    assert cos[-1] >= cos[0]


def test_correction_from_hidden_skips_the_head_and_matches_dense_numpy(engine, W_ref):
    """Exact eq. 2 from the captured hidden rows, with llama.cpp stopped after result_norm:
    the rows are the ones a full decode feeds the head, R equals a float64 numpy softmax of
    W h, and the KV cache the shortened graph leaves behind is the full decode's."""
    toks = engine.tokenize(PROMPT)
    target = engine.tokenize(" card arrival\n", add_bos=False)
    flags = [False] * (len(toks) - 1) + [True] * len(target) + [False]
    # the full decode: logits and the captured rows that produced them
    engine.reset()
    engine.native.set_capture(True, len(target))
    logits = engine.decode(toks + target, flags)
    h_full = engine.native.captured().copy()
    engine.native.set_capture(False, 0)
    nxt_full = engine.decode([target[-1]], "last")[0]
    # the shortened graph: same rows, and a next decode on its KV cache gives the same logits
    engine.reset()
    hits = engine.native.hits(1)
    hidden = engine.hidden_states(toks + target, flags)
    assert engine.native.hits(1) > hits
    np.testing.assert_allclose(hidden, h_full, rtol=0, atol=1e-4)
    nxt = engine.decode([target[-1]], "last")[0]
    np.testing.assert_allclose(nxt, nxt_full, rtol=0, atol=1e-3 * np.abs(nxt_full).max())
    # the captured rows are what the head saw: llama.cpp's logits are W h up to its Q8_0 activations
    # (that rounding moves logits by up to ~0.2, enough to flip near-ties of the argmax)
    z = hidden.astype(np.float64) @ W_ref.T.astype(np.float64)
    ref_logits = q8_0_roundtrip(hidden) @ W_ref.T
    assert np.abs(logits - ref_logits).max() < 2e-3 * np.abs(ref_logits).max() + 1e-3
    # R against the float64 softmax of W h (not llama.cpp's logits)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    W64 = W_ref.astype(np.float64)
    per_pos_ref = W64[target] - p @ W64
    lm = engine.lm_head
    R = lm.correction_from_hidden(hidden, target)
    np.testing.assert_allclose(R, per_pos_ref.mean(0), rtol=0, atol=1e-3 * np.abs(per_pos_ref).max())
    per_pos = lm.correction_from_hidden(hidden, target, per_position=True)
    np.testing.assert_allclose(per_pos, per_pos_ref, rtol=0, atol=1e-3 * np.abs(per_pos_ref).max())
    for a, b in zip(per_pos, per_pos_ref):
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99999
    # and it is the logits path's R up to llama.cpp's activation rounding
    R_logits = lm.correction(logits, target)
    assert R @ R_logits / np.linalg.norm(R) / np.linalg.norm(R_logits) > 0.999


@pytest.mark.parametrize("answer", [" card arrival", " my card has still not arrived after two weeks"])
def test_extract_exact_R_by_either_path_matches_softmax_of_W_h(engine, W_ref, answer):
    """extract() takes the one-pass hidden path for short answers and llama.cpp's logits for long
    ones (HIDDEN_R_MAX_TOKENS); both give eq. 2's R_m for the model's own states."""
    from miita_edge.method.extract import HIDDEN_R_MAX_TOKENS, extract
    from miita_edge.method.templates import get_template

    tpl = get_template("plain")
    e = extract(engine, tpl, "my card has not arrived yet", answer, skip_bos=False, per_position=False)
    T = len(e.target)
    assert (T <= HIDDEN_R_MAX_TOKENS) == (answer == " card arrival")
    flags = [False] * (len(e.prompt) - 1) + [True] * T + [False]
    engine.reset()
    hidden = engine.hidden_states(e.prompt + e.target, flags)
    z = hidden.astype(np.float64) @ W_ref.T.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    W64 = W_ref.astype(np.float64)
    R_ref = (W64[e.target] - p @ W64).mean(0)
    cos = e.R_mean @ R_ref / np.linalg.norm(e.R_mean) / np.linalg.norm(R_ref)
    assert cos > (0.99999 if T <= HIDDEN_R_MAX_TOKENS else 0.999), cos


@pytest.mark.parametrize("per_position", [False, True])
def test_shared_head_pass_is_bitwise_the_per_example_R(engine, per_position):
    """finish_corrections (several examples' hidden rows in one online-softmax pass, as ingest
    batches them) gives exactly the R of extract() run on each example alone."""
    from miita_edge.method.extract import PendingR, extract, finish_corrections
    from miita_edge.method.templates import get_template

    tpl = get_template("plain")
    pairs = [("my card has not arrived yet", " card arrival"), ("I was charged twice", " refund"),
             ("how do I top up by bank transfer?", " top up"), ("what is the exchange rate?", " rate")]
    alone = [extract(engine, tpl, x, y, skip_bos=True, per_position=per_position) for x, y in pairs]
    pending = [extract(engine, tpl, x, y, skip_bos=True, per_position=per_position, defer=True) for x, y in pairs]
    assert all(isinstance(p, PendingR) for p in pending)
    shared = finish_corrections(engine, pending, per_position)
    for a, b in zip(alone, shared):
        assert a.prompt == b.prompt and a.target == b.target
        np.testing.assert_array_equal(a.key, b.key)
        np.testing.assert_array_equal(a.R, b.R)
    assert finish_corrections(engine, [], per_position) == []


@pytest.mark.parametrize("K", [1, 8, 64])
def test_native_restricted_uncertainty_matches_the_numpy_equations(engine, K):
    """Eqs. 6-7 in one native call (the serving path) against top_k_restricted,
    restricted_entropy_grad and W_Vᵀg in numpy, on the model's own logits; and its errors."""
    from miita_edge.method.retrieval import restricted_entropy_grad, top_k_restricted, uncertainty_direction

    st = engine.query(engine.tokenize(PROMPT))
    lm = engine.lm_head
    ids, p, g, H, r = lm.restricted_uncertainty(st.logits, K)
    ids_ref, p_ref = top_k_restricted(st.logits, K)
    g_ref, H_ref = restricted_entropy_grad(p_ref)
    r_ref, _ = uncertainty_direction(lm.rows(ids_ref), g_ref, 0.0)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_allclose(p, p_ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-15)
    assert H == pytest.approx(H_ref, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(r, r_ref, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(r_ref).max()))
    bad = st.logits.copy()
    bad[123] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        lm.restricted_uncertainty(bad, K)
    bad[123] = np.inf
    with pytest.raises(ValueError, match="inf"):
        lm.restricted_uncertainty(bad, K)
    with pytest.raises(ValueError, match="every logit is -inf"):
        lm.restricted_uncertainty(np.full_like(st.logits, -np.inf), K)


def test_retrieve_with_the_native_eqs_6_7_equals_the_numpy_path(engine):
    """retrieve(..., restricted_fn=LMHeadRows.restricted_uncertainty), as Miita.plan calls it,
    selects and weights the same prototypes as the numpy path through W_rows_fn."""
    from miita_edge.method.retrieval import RetrievalConfig, ScanIndex, retrieve

    rng = np.random.default_rng(3)
    H = engine.n_embd
    st = engine.query(engine.tokenize(PROMPT))
    J = 3000  # > ScanIndex.SHADOW_MIN_ROWS: the int8 recall path
    D = rng.standard_normal((J, H))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    anchors = rng.standard_normal((J, H))
    owner = np.arange(J)
    idx = ScanIndex.build(anchors, owner, D)
    k_q = anchors[17] + 0.3 * rng.standard_normal(H)
    cfg = RetrievalConfig()
    for mode in ("sem+unc", "uncertainty"):
        a = retrieve(k_q, anchors, owner, D, st.logits, engine.lm_head.rows, cfg, mode, index=idx)
        b = retrieve(k_q, anchors, owner, D, st.logits, None, cfg, mode, index=idx,
                     restricted_fn=engine.lm_head.restricted_uncertainty)
        assert a.ids.tolist() == b.ids.tolist() and a.candidates.tolist() == b.candidates.tolist()
        np.testing.assert_allclose(a.weights, b.weights, rtol=1e-9)
        np.testing.assert_allclose(a.U, b.U, rtol=1e-9, atol=1e-15)
        assert a.H_hat == pytest.approx(b.H_hat, rel=1e-12)


def test_uncertainty_gradient_matches_finite_differences(engine, W_ref):
    """r_q = W_Vᵀ g (eq. 7) is the gradient of the restricted entropy wrt the hidden state."""
    from miita_edge.method.retrieval import restricted_entropy_grad, top_k_restricted

    toks = engine.tokenize(PROMPT)
    st = engine.query(toks)
    ids, p_hat = top_k_restricted(st.logits, 64)
    g, _ = restricted_entropy_grad(p_hat)
    r_q = engine.lm_head.weighted_sum(ids, g)
    Wv = W_ref[ids].astype(np.float64)
    h0 = np.zeros(engine.n_embd)
    z0 = st.logits[ids].astype(np.float64)  # the logits llama.cpp produced; moving h by δ adds W_V δ

    def H(h):
        z = z0 + Wv @ h
        q = np.exp(z - z.max())
        q /= q.sum()
        return -(q * np.log(q)).sum()

    eps = 1e-4
    fd = np.array([(H(h0 + eps * e) - H(h0 - eps * e)) / (2 * eps) for e in np.eye(len(h0))])
    np.testing.assert_allclose(r_q, fd, rtol=1e-3, atol=1e-5 * np.abs(fd).max() + 1e-9)


def test_native_gather_matches_gguf_dequantize_on_real_tensors(engine, gguf_reader):
    from gguf import quants
    from gguf.constants import GGMLQuantizationType as QT

    from miita_edge import _native

    seen = set()
    for t in gguf_reader.tensors:
        qt = QT(t.tensor_type)
        if qt in seen or len(t.shape) != 2:
            continue
        seen.add(qt)
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        n_embd, n_rows = int(t.shape[0]), int(t.shape[1])
        ref = quants.dequantize(t.data, qt).reshape(n_rows, n_embd)
        ids = np.array([0, 1, n_rows // 2, n_rows - 1], np.int32)
        got = _native.lm_gather(raw, int(qt), n_rows, n_embd, raw.size // n_rows, ids)
        np.testing.assert_array_equal(got, ref[ids])
    assert {QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.Q5_0} <= seen


def complete(engine, prompt: str, max_tokens: int = 32, stop=("\n",), **kw):
    """A plain completion of a text prompt (no memory): one query, then generate."""
    return engine.generate(engine.query(engine.tokenize(prompt)), max_tokens=max_tokens, stop=stop, **kw)


def test_a_stop_after_text_skips_blanks_before_the_answer(engine):
    # " " as the stop: greedy continuations of "Answer:" open with a space-led token, which the
    # archived rule reads as the answer's end (""), and stop_after_text as a blank to skip.
    from miita_edge.runtime.engine_types import stop_position

    prompt = "Question: What is two plus two?\nAnswer:"
    free = complete(engine, prompt, max_tokens=12, stop=())
    cut = stop_position(free.text, (" ",), after_text=True)
    assert free.text.startswith(" ") and cut > 1, free.text  # what makes this case decide something
    old = complete(engine, prompt, max_tokens=12, stop=(" ",))
    assert old.text == "" and old.stop_reason == "stop" and len(old.tokens) == 1
    engine.config.stop_after_text = True
    try:
        new = complete(engine, prompt, max_tokens=12, stop=(" ",))
    finally:
        engine.config.stop_after_text = False
    assert new.text == free.text[:cut] and new.stop_reason == "stop"
    assert new.tokens == free.tokens[:len(new.tokens)]  # the same greedy path, stopped later


def test_greedy_generation_is_deterministic_and_stops(engine):
    a = complete(engine, "Question: What is two plus two?\nAnswer:", max_tokens=16)
    b = complete(engine, "Question: What is two plus two?\nAnswer:", max_tokens=16)
    assert a.text == b.text and a.tokens == b.tokens
    assert "\n" not in a.text
    assert a.stop_reason in {"stop", "eog", "length"}
    c = complete(engine, "Once upon a time", max_tokens=5, stop=())
    assert len(c.tokens) == 5 and c.stop_reason == "length"
    s1 = complete(engine, "Once upon a time", max_tokens=8, stop=(), temperature=1.0, seed=3)
    s2 = complete(engine, "Once upon a time", max_tokens=8, stop=(), temperature=1.0, seed=3)
    assert s1.tokens == s2.tokens


def test_amx_regression_decode_does_not_crash(model_path):
    """On AMX CPUs the default extra buffer types segfault in the first decode (llama.cpp #20824)."""
    code = ("from miita_edge.runtime.engine import Engine; e = Engine(%r); "
            "print(repr(e.generate(e.query(e.tokenize('Hello')), max_tokens=2).text))" % str(model_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_hold_makes_the_memory_token_win_and_keeps_the_cache(engine):
    """A hold that wants the frozen model's second choice at the first answer position: the step
    is decoded again with lead_push's addition on top, the token comes out, the α list keeps one
    entry per step, and the cache goes on from that token as a plain decode of it would (the
    addition is after every layer, so decoding a step again changes only its logits)."""
    from miita_edge.method.steering import lead_push

    prompt = engine.tokenize("Question: What is the capital of France?\nAnswer:")
    state = engine.query(prompt)
    second = int(np.argsort(-state.logits)[1])
    zero = np.zeros(engine.n_embd, np.float32)  # a plan that steers with nothing, so the hold is asked
    calls = []

    def hold(step, generated, logits, token):
        calls.append(step)
        if step > 0 or token == second:
            return None
        return lead_push(logits, second, engine.lm_head.rows, None, engine.info.logit_mult)

    g = engine.generate(state, max_tokens=4, stop=(), plan=lambda s, gen: zero, eta=1.0, mode="ungated", hold=hold)
    assert g.tokens[0] == second and g.raised == [0]
    assert len(g.alphas) == len(g.tokens) and calls[:2] == [0, 0]
    # the rest equals a frozen continuation after the forced token, decoded one token at a time
    # from the same cache (the same kernels as generate's steps)
    engine.query(prompt)
    engine.truncate(len(prompt) - 1)  # generate's step 0 decodes the last prompt token alone
    engine.decode([prompt[-1]], "last")
    logits = engine.decode([second], "last")[0]
    rest = []
    for _ in range(len(g.tokens) - 1):
        t = int(np.argmax(logits))
        rest.append(t)
        logits = engine.decode([t], "last")[0]
    assert g.tokens[1:] == rest
    # without the hold the same plan gives the frozen first token
    plain = engine.generate(engine.query(prompt), max_tokens=1, stop=(), plan=lambda s, gen: zero, eta=1.0,
                            mode="ungated")
    assert plain.tokens[0] == int(np.argmax(state.logits)) != second and plain.raised == []


def test_generate_owns_the_cache_another_prompt_decoded_since_the_query_changes_nothing(engine):
    """Whoever decodes other prompts between ``query`` and ``generate`` (a derived cache)
    need not put the query's prompt back: the engine knows what its cache holds and decodes the
    prompt again. Reference: the same generation with nothing decoded in between."""
    toks = engine.tokenize("Question: what is the capital of France?\nAnswer:", add_bos=True)
    other = engine.tokenize("Tell me a short story about a lighthouse keeper.", add_bos=True)
    state = engine.query(toks)
    assert engine.holds(toks) and not engine.holds(other)
    ref = engine.generate(state, max_tokens=8, stop=())
    assert not engine.holds(toks)  # generating appended to the cache
    state = engine.query(toks)
    engine.query(other)  # another prompt in the cache
    assert not engine.holds(toks)
    again = engine.generate(state, max_tokens=8, stop=())
    assert again.tokens == ref.tokens and again.text == ref.text
    engine.query(toks)
    engine.truncate(len(toks) - 1)  # a partial cache is not the prompt either
    assert not engine.holds(toks)


def test_holds_tracks_the_prompt_through_appends_truncates_and_raw_batches(engine):
    """``holds`` is exact: appending after the prompt and cutting back to it keeps it held (what a
    teacher-forced continuation read after the prompt does); cutting into it, or decoding anything
    from a reset, does not."""
    toks = engine.tokenize("Question: name a colour.\nAnswer:", add_bos=True)
    engine.query(toks)
    engine.decode(engine.tokenize(" blue and green", add_bos=False), "all")
    assert not engine.holds(toks)
    engine.truncate(len(toks))
    assert engine.holds(toks)
    engine.truncate(len(toks) - 1)
    engine.decode([toks[-1]], "last")  # the same token again: rows intact? not knowable, so not held
    assert not engine.holds(toks)
    engine.reset()
    engine.decode(toks, "last")  # the same tokens, but not through query: not a held prompt
    assert not engine.holds(toks)
