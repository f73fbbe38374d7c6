"""LM-head kernels on synthetic matrices of every type gguf-py can quantize,
against gguf-py's dequantization and a dense numpy reference (fast tier)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from miita_edge import _native

TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1]


def encode(W: np.ndarray, qt: QT) -> np.ndarray:
    if qt == QT.F32:
        return W.astype(np.float32).view(np.uint8).reshape(-1)
    if qt == QT.F16:
        return W.astype(np.float16).view(np.uint8).reshape(-1)
    return np.ascontiguousarray(quants.quantize(W, qt)).view(np.uint8).reshape(-1)


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n_rows,n_embd", [(50, 64), (300, 256)])
def test_kernels_on_type(qt, n_rows, n_embd):
    rng = np.random.default_rng(int(qt) + n_rows)
    W = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    raw = encode(W, qt)
    block, size = GGML_QUANT_SIZES[qt]
    row_bytes = n_embd // block * size
    assert raw.size == n_rows * row_bytes
    if qt == QT.F32:
        ref = W
    elif qt == QT.F16:
        ref = W.astype(np.float16).astype(np.float32)
    else:
        ref = quants.dequantize(raw.reshape(n_rows, row_bytes), qt).reshape(n_rows, n_embd)
    args = (raw, int(qt), n_rows, n_embd, row_bytes)

    ids = rng.integers(0, n_rows, 37).astype(np.int32)
    np.testing.assert_array_equal(_native.lm_gather(*args, ids), ref[ids])

    w = rng.standard_normal(37).astype(np.float32)
    np.testing.assert_allclose(_native.lm_weighted_sum(*args, ids, w, 2), w.astype(np.float64) @ ref[ids],
                               rtol=1e-5, atol=1e-4)

    T = 3
    logits = (rng.standard_normal((T, n_rows)) * 3).astype(np.float32)
    targets = rng.integers(0, n_rows, T).astype(np.int32)
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    R_ref = ref[targets].astype(np.float64) - p @ ref
    np.testing.assert_allclose(_native.lm_correction(*args, logits, targets, 0, True, 2), R_ref,
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_native.lm_correction(*args, logits, targets, 0, False, 1), R_ref.mean(0),
                               rtol=1e-4, atol=1e-4)
    # top_k = n_rows is the exact mode; top_k = 5 keeps the 5 most probable rows, exact normaliser
    k = 5
    top = np.argsort(-z, axis=1, kind="stable")[:, :k]
    Rk = np.stack([ref[targets[t]] - p[t, top[t]] @ ref[top[t]] for t in range(T)])
    np.testing.assert_allclose(_native.lm_correction(*args, logits, targets, k, True, 2), Rk, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("H", [640, 64, 13, 8, 1])
def test_bit_scores_match_dense_sign_dot(H):
    """The packed-bit kernel equals q · s with s = ±1 from np.packbits' bit order (dense numpy)."""
    rng = np.random.default_rng(H)
    S = rng.standard_normal((257, H)) >= 0
    q = rng.standard_normal(H).astype(np.float32)
    ref = np.where(S, 1.0, -1.0) @ q.astype(np.float64)
    got = _native.bit_scores(np.packbits(S, axis=1), q)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, np.abs(ref).max()))
    with pytest.raises(ValueError, match="wrong number of bytes"):
        _native.bit_scores(np.packbits(S, axis=1)[:, :0], q) if H > 0 else None


def test_bit_scores_drive_the_same_vote_as_float_anchors():
    from miita_edge.memory import codecs
    from miita_edge.method.steering import knn_prototypes

    rng = np.random.default_rng(5)
    H = 64
    A = codecs.roundtrip(rng.standard_normal((400, H)).astype(np.float32), "bit")  # ±1 rows
    owner = rng.integers(0, 12, 400)
    q = rng.standard_normal(H)
    ref = knn_prototypes(q, A, owner, 8, 0.05)
    qn = (q / np.linalg.norm(q)).astype(np.float32)
    s = _native.bit_scores(np.packbits(A >= 0, axis=1), qn) / np.sqrt(H)
    got = knn_prototypes(q, A, owner, 8, 0.05, scores=s)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], atol=1e-5)


@pytest.mark.parametrize("B", [160, 80, 13, 1])
def test_hamming_nearest_matches_brute_force(B):
    """Each row's nearest centroid by Hamming distance, ties to the lower centroid (row bytes that
    are not a multiple of 8 take the byte tail), against dense numpy; both thread counts agree."""
    rng = np.random.default_rng(B)
    rows = rng.integers(0, 256, (700, B), dtype=np.uint8)
    cents = np.concatenate([rows[:5], rng.integers(0, 256, (40, B), dtype=np.uint8), rows[:5]])  # exact ties
    D = (np.unpackbits(rows, axis=1)[:, None, :] != np.unpackbits(cents, axis=1)[None, :, :]).sum(-1)
    want = D.argmin(axis=1)  # the first minimum: the lower centroid
    np.testing.assert_array_equal(_native.hamming_nearest(rows, cents, 1), want)
    np.testing.assert_array_equal(_native.hamming_nearest(rows, cents, 2), want)
    with pytest.raises(ValueError):
        _native.hamming_nearest(rows, cents[:, :-1] if B > 1 else cents[:0])


@pytest.mark.parametrize("B", [160, 80, 13])
def test_masked_hamming_top_matches_brute_force(B):
    """The k rows of the ranges nearest to q under the mask, in (distance, row) order: ranges out of
    order, an empty range, ties at the cut (duplicated rows), k beyond the rows in the ranges."""
    rng = np.random.default_rng(B + 1)
    rows = rng.integers(0, 256, (3000, B), dtype=np.uint8)
    rows[2000:2100] = rows[100]  # a hundred rows at one distance: the cut falls among ties
    q = rng.integers(0, 256, B, dtype=np.uint8)
    mask = rng.integers(0, 256, B, dtype=np.uint8)
    starts, ends = np.array([2500, 1900, 0, 700]), np.array([2900, 2200, 300, 700])
    idx = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
    d = np.unpackbits((rows[idx] ^ q) & mask, axis=1).sum(axis=1)
    order = idx[np.lexsort((idx, d))]
    for k in (0, 1, 37, 256, len(idx), len(idx) + 50):
        got = _native.masked_hamming_top(rows, starts, ends, q, mask, k)
        np.testing.assert_array_equal(got, order[:k])
    with pytest.raises(ValueError, match="outside"):
        _native.masked_hamming_top(rows, np.array([0]), np.array([3001]), q, mask, 4)
    with pytest.raises(ValueError):
        _native.masked_hamming_top(rows, starts, ends, q[:-1], mask, 4)


@pytest.mark.parametrize("B", [160, 13])
def test_masked_hamming_top_on_two_threads_is_the_one_thread_result(B):
    """The distance pass splits by ranges over threads (one per 2,048 rows at most): the same rows
    in the same order whatever the thread count, against dense numpy."""
    rng = np.random.default_rng(B + 2)
    rows = rng.integers(0, 256, (12000, B), dtype=np.uint8)
    rows[5000:5300] = rows[7]  # ties at the cut
    q, mask = rng.integers(0, 256, B, dtype=np.uint8), rng.integers(0, 256, B, dtype=np.uint8)
    starts, ends = np.arange(0, 12000, 400)[::-1].copy(), np.arange(300, 12001, 400)[::-1].copy()
    idx = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
    d = np.unpackbits((rows[idx] ^ q) & mask, axis=1).sum(axis=1)
    order = idx[np.lexsort((idx, d))]
    for k in (1, 256, 5000):
        for threads in (1, 2, 3):
            np.testing.assert_array_equal(_native.masked_hamming_top(rows, starts, ends, q, mask, k, threads), order[:k])


def test_bit_scores_of_a_row_do_not_depend_on_how_many_rows_are_scored():
    """Few rows are scored through per-nibble sums, many through a per-byte table built from them:
    a row's score must be bitwise the same either way (the recall front re-scores a few hundred
    rows, the exact scan all of them, and their selections are compared bitwise)."""
    rng = np.random.default_rng(11)
    for H in (1280, 645):
        rows = rng.integers(0, 256, (3000, (H + 7) // 8), dtype=np.uint8)
        q = rng.standard_normal(H).astype(np.float32)
        full = _native.bit_scores(rows, q)
        for a, b in ((0, 10), (100, 1123), (2990, 3000)):
            np.testing.assert_array_equal(_native.bit_scores(rows[a:b], q), full[a:b])


@pytest.mark.parametrize("n", [1280, 1279, 8, 7, 1])
def test_sign_code_is_strong_half_packed(n):
    """The native code of a query equals index_files.strong_half packed (the reference in numpy),
    with ties at the median, zeros and negative zeros."""
    from miita_edge.method.index_files import strong_half

    rng = np.random.default_rng(n)
    for q in (rng.standard_normal(n).astype(np.float32),
              np.round(rng.standard_normal(n), 1).astype(np.float32),  # many equal magnitudes
              np.where(rng.random(n) < 0.3, np.float32(-0.0), rng.standard_normal(n)).astype(np.float32)):
        s, strong = strong_half(q)
        code, mask = _native.sign_code(q)
        np.testing.assert_array_equal(code, np.packbits(s))
        np.testing.assert_array_equal(mask, np.packbits(strong))
    with pytest.raises(ValueError):
        _native.sign_code(np.zeros(0, np.float32))


@pytest.mark.parametrize("B", [160, 13])
def test_range_min_hamming_matches_brute_force(B):
    rng = np.random.default_rng(B + 3)
    rows = rng.integers(0, 256, (500, B), dtype=np.uint8)
    q = rng.integers(0, 256, B, dtype=np.uint8)
    rows[40] = q  # distance 0
    starts, ends = np.array([30, 0, 200, 450, 7]), np.array([60, 1, 200, 500, 8])
    d = np.unpackbits(rows ^ q, axis=1).sum(axis=1)
    want = [d[s:e].min() if e > s else -1 for s, e in zip(starts, ends)]
    np.testing.assert_array_equal(_native.range_min_hamming(rows, starts, ends, q), want)
    with pytest.raises(ValueError, match="outside"):
        _native.range_min_hamming(rows, np.array([0]), np.array([501]), q)


@pytest.mark.parametrize("parts,mean,order,key_dim", [(1, False, False, 640), (2, True, True, 1280),
                                                      (2, True, True, 1000), (3, True, False, 1920)])
def test_prepare_query_is_prepare_key_as_float32(parts, mean, order, key_dim):
    """MemoryBank.prepare_query (native) against prepare_key (numpy): equal to float32 rounding,
    the same sign on every coordinate (what 1-bit keys compare), exactly 0 where prepare_key is;
    from the callback's sums and row counts it divides as key_pooling.key_mean does."""
    from miita_edge.memory.bank import MemoryBank
    from miita_edge.method.presets import default_preset
    from miita_edge.runtime.key_pooling import key_mean

    H = 640
    rng = np.random.default_rng(parts * 7 + key_dim)
    full = parts * H
    m = rng.standard_normal(full).astype(np.float32) if mean else None
    o = rng.permutation(full) if order else None
    bank = MemoryBank(default_preset().bank, H, m, key_parts=parts, key_order=o, key_dim=key_dim)
    for _ in range(5):
        raw = rng.standard_normal(full).astype(np.float32) * 3
        if mean:
            raw[:50] = bank.key_mean[:50]  # centred to exactly 0
        ref = bank.prepare_key(raw)
        got = bank.prepare_query(raw)
        assert got.dtype == np.float32 and got.shape == (key_dim,)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-7)
        np.testing.assert_array_equal(got >= 0, ref >= 0)
        np.testing.assert_array_equal(got == 0, ref == 0)
        sums, rows = raw * 7, rng.integers(0, 9, parts)
        np.testing.assert_array_equal(bank.prepare_query(sums, rows) >= 0, bank.prepare_key(key_mean(sums, rows)) >= 0)
        np.testing.assert_allclose(bank.prepare_query(sums, rows), bank.prepare_key(key_mean(sums, rows)),
                                   rtol=0, atol=2e-7)
        np.testing.assert_allclose(bank.prepare_query(sums, [5]), bank.prepare_key(key_mean(sums, 5)), rtol=0, atol=2e-7)
    np.testing.assert_array_equal(bank.prepare_query(np.zeros(full, np.float32) if not mean else bank.key_mean.copy()),
                                  np.zeros(key_dim, np.float32))
    with pytest.raises(ValueError, match="shape"):
        bank.prepare_query(np.zeros(full + 1, np.float32))
    with pytest.raises(ValueError):
        _native.prepare_query(np.zeros(full, np.float32), parts, m, o, key_dim, np.ones(parts + 1, np.int64))


@pytest.mark.parametrize("n,H", [(1, 1), (3, 31), (5, 32), (4097, 64), (9000, 640), (17, 645)])
def test_i8_scores_match_numpy(n, H):
    """Both SIMD widths, the scalar tail and the two-thread split against float64 numpy."""
    rng = np.random.default_rng(H)
    rows = rng.integers(-127, 128, (n, H)).astype(np.int8)
    scales = rng.random(n).astype(np.float32)
    q = rng.standard_normal(H).astype(np.float32)
    ref = scales.astype(np.float64) * (rows.astype(np.float64) @ q.astype(np.float64))
    got = _native.i8_scores(rows, scales, q)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.sqrt(H) * 127)
    with pytest.raises(ValueError):
        _native.i8_scores(rows, scales[:-1], q) if n > 1 else _native.i8_scores(rows, scales, q[:0])


@pytest.mark.parametrize("spread", [0.1, 30.0, 400.0])
def test_exact_mean_correction_q8_matches_dense_across_logit_ranges(spread):
    """The exact mean path (vectorised exp, one head pass) against float64 numpy, from nearly
    uniform distributions to ones whose small terms underflow float32 (spread 400)."""
    rng = np.random.default_rng(int(spread * 10))
    n_rows, n_embd, T = 1000 + 7, 96, 4  # a row count that is not a multiple of the vector width
    W = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    raw = encode(W, QT.Q8_0)
    ref = quants.dequantize(raw.reshape(n_rows, -1), QT.Q8_0).reshape(n_rows, n_embd).astype(np.float64)
    logits = (rng.standard_normal((T, n_rows)) * spread).astype(np.float32)
    targets = rng.integers(0, n_rows, T).astype(np.int32)
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    R_ref = (ref[targets] - p @ ref).mean(0)
    for threads in (1, 2, 3):
        got = _native.lm_correction(raw, int(QT.Q8_0), n_rows, n_embd, raw.size // n_rows, logits, targets, 0,
                                    False, threads)
        np.testing.assert_allclose(got, R_ref, rtol=0, atol=2e-5 * max(1.0, np.abs(R_ref).max()))


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("spread,T", [(0.05, 4), (3.0, 4), (40.0, 4), (3.0, 1), (40.0, 2), (3.0, 3), (40.0, 7)])
def test_correction_from_hidden_matches_dense_softmax(qt, spread, T):
    """Eq. 2 from hidden states (one online-softmax pass: running maxima, rescaling, dropped
    terms below e^-32, thread merge) against float64 numpy on the dequantised matrix. Rows are
    ordered by ascending logit of position 0, so its running maximum rises on every row. T covers
    each register-blocked position count (1-4) and a split into chunks of 4 (7); the row count
    leaves a partial group of 8 rows in every thread."""
    rng = np.random.default_rng(int(qt) * 7 + int(spread * 100) + T)
    n_rows, n_embd = 3000 + 13, 64
    W = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    hidden = (rng.standard_normal((T, n_embd)) * spread / np.sqrt(n_embd)).astype(np.float32)
    W = W[np.argsort(W @ hidden[0], kind="stable")]
    raw = encode(W, qt)
    row_bytes = raw.size // n_rows
    if qt == QT.F32:
        ref = W.astype(np.float64)
    elif qt == QT.F16:
        ref = W.astype(np.float16).astype(np.float64)
    else:
        ref = quants.dequantize(raw.reshape(n_rows, row_bytes), qt).reshape(n_rows, n_embd).astype(np.float64)
    z = hidden.astype(np.float64) @ ref.T
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    targets = rng.integers(0, n_rows, T).astype(np.int32)
    R_ref = ref[targets] - p @ ref
    tol = 2e-4 * max(1.0, np.abs(R_ref).max())
    for threads in (1, 2, 3):
        got = _native.lm_correction_hidden(raw, int(qt), n_rows, n_embd, row_bytes, hidden, targets, True, threads)
        np.testing.assert_allclose(got, R_ref, rtol=0, atol=tol)
        got = _native.lm_correction_hidden(raw, int(qt), n_rows, n_embd, row_bytes, hidden, targets, False, threads)
        np.testing.assert_allclose(got, R_ref.mean(0), rtol=0, atol=tol)
    # the same R as the logits path fed with the same (float64-exact) logits
    via_logits = _native.lm_correction(raw, int(qt), n_rows, n_embd, row_bytes, z.astype(np.float32), targets, 0,
                                       True, 2)
    np.testing.assert_allclose(got, via_logits.mean(0), rtol=0, atol=tol)


def test_correction_from_hidden_rejects_bad_input():
    W = np.zeros((10, 32), np.float32).view(np.uint8).reshape(-1)
    h = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="hidden must be"):
        _native.lm_correction_hidden(W, int(QT.F32), 10, 32, 128, h[:1], np.array([1, 2], np.int32))
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        _native.lm_correction_hidden(W, int(QT.F32), 10, 32, 128, h, np.array([1, 10], np.int32))
    h[1, 3] = np.nan
    with pytest.raises(RuntimeError, match="non-finite"):
        _native.lm_correction_hidden(W, int(QT.F32), 10, 32, 128, h, np.array([1, 2], np.int32))


@pytest.mark.parametrize("n,k", [(5000, 64), (4099, 1), (70000, 300), (33, 33), (262144 + 5, 64), (300000, 2000)])
def test_top_k_equals_stable_descending_sort_with_many_ties(n, k):
    """The vectorised heap pass against numpy's stable sort, on values with many exact ties
    (small integers), so that the index tie-break is exercised on every path; from 262,144
    values on, the pass is split over threads (with OpenMP) and the per-thread bests merged."""
    rng = np.random.default_rng(n + k)
    for x in (rng.integers(-20, 20, n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
              np.sort(rng.standard_normal(n)).astype(np.float32)):  # ascending: the heap changes all the time
        ref = np.argsort(-x.astype(np.float64), kind="stable")[:k]
        np.testing.assert_array_equal(_native.top_k(x, k), ref)
    for pos in (0, n // 2, n - 1):  # a NaN in the heap's first fill, a vector block, the tail
        x = rng.standard_normal(n).astype(np.float32)
        x[pos] = np.nan
        with pytest.raises(RuntimeError, match="NaN"):
            _native.top_k(x, k)


@pytest.mark.parametrize("H", [64, 2048])
@pytest.mark.parametrize("segmented", [False, True])
def test_i8_recall_is_the_bounded_superset_of_the_exact_top_r(segmented, H):
    """Brute force in float64: the returned segments are exactly those whose upper bound reaches
    the R-th largest lower bound, and they contain the exact Top_R of the float scores. The
    reference rebuilds the kernel's bound on its own: the query rounded to int16 (u_hat = sigma k,
    L levels with 127 L H < 2^31, so H = 2048 has fewer levels), the slack = the row's residual
    norm + s * 127 * sqrt(H) * ||u - u_hat|| + 1e-5."""
    from miita_edge.method.scan_index import _int8_shadow, _unit32

    rng = np.random.default_rng(7 + segmented + H)
    n = 3000
    centers = rng.standard_normal((40, H))
    U = _unit32(centers[rng.integers(0, 40, n)] + 0.05 * rng.standard_normal((n, H)))  # near-duplicates
    q8, sc, err = _int8_shadow(U)
    starts = np.r_[0, np.sort(rng.choice(np.arange(1, n), 799, replace=False))] if segmented else np.zeros(0, np.int64)
    bounds = np.r_[starts, n] if segmented else np.arange(n + 1)
    u = U[5] + 0.01 * rng.standard_normal(H)
    u = (u / np.linalg.norm(u)).astype(np.float32)
    L = min(16383, (2**31 - 1) // (127 * H))
    sigma = np.abs(u.astype(np.float64)).max() / L
    k = np.rint(u / sigma)
    assert np.abs(k).max() <= L and np.abs(q8.astype(np.int64)).max() * L * H < 2**31
    qerr = 127 * np.sqrt(H) * np.linalg.norm(u - sigma * k)
    approx = sc.astype(np.float64) * sigma * (q8.astype(np.float64) @ k)
    slack = err.astype(np.float64) + sc * qerr + 1e-5
    assert (np.abs(approx - U.astype(np.float64) @ u) <= slack).all()  # the bound is a bound
    lo = np.maximum.reduceat(approx - slack, bounds[:-1])
    hi = np.maximum.reduceat(approx + slack, bounds[:-1])
    exact = np.maximum.reduceat(U.astype(np.float64) @ u, bounds[:-1])
    for R in (1, 8, 50):
        got = _native.i8_recall(q8, sc, err, starts.astype(np.int64), u, R)
        theta = np.sort(lo)[::-1][R - 1]
        want = np.flatnonzero(hi >= theta)
        # float32 vs float64 arithmetic can move a row that sits exactly on the threshold
        near = set(np.flatnonzero(np.abs(hi - theta) < 1e-5))
        assert set(want) ^ set(got) <= near
        assert set(np.argsort(-exact, kind="stable")[:R]) <= set(got)
        assert got.size < lo.size  # the bound prunes: the point of the shadow
    with pytest.raises(RuntimeError, match="segment starts"):
        _native.i8_recall(q8, sc, err, np.array([0, 5, 5], np.int64), u, 3)


@pytest.mark.parametrize("n_a,n_b,H", [(3000, 2000, 2048), (300, 200, 64)])
def test_i8_recall_pair_equals_two_single_scans(n_a, n_b, H):
    """The concurrent pair (large scans, one thread each) and its sequential fallback (small
    ones) return exactly what two i8_recall calls return, segments included."""
    from miita_edge.method.scan_index import _int8_shadow, _unit32

    rng = np.random.default_rng(n_a + H)
    qa, sa, ea = _int8_shadow(_unit32(rng.standard_normal((n_a, H))))
    qb, sb, eb = _int8_shadow(_unit32(rng.standard_normal((n_b, H))))
    seg_a = np.r_[0, np.sort(rng.choice(np.arange(1, n_a), n_a // 3, replace=False))].astype(np.int64)
    seg_b = np.zeros(0, np.int64)
    ua, ub = (_unit32(rng.standard_normal((1, H)))[0] for _ in range(2))
    for Ra, Rb in ((8, 8), (1, 50)):
        got_a, got_b = _native.i8_recall_pair(qa, sa, ea, seg_a, ua, Ra, qb, sb, eb, seg_b, ub, Rb)
        np.testing.assert_array_equal(got_a, _native.i8_recall(qa, sa, ea, seg_a, ua, Ra))
        np.testing.assert_array_equal(got_b, _native.i8_recall(qb, sb, eb, seg_b, ub, Rb))
    with pytest.raises(RuntimeError, match="segment starts"):
        _native.i8_recall_pair(qa, sa, ea, np.array([0, 5, 5], np.int64), ua, 3, qb, sb, eb, seg_b, ub, 3)
    with pytest.raises(ValueError, match="same H"):
        _native.i8_recall_pair(qa, sa, ea, seg_a, ua, 3, qb[:, :32], sb, eb, seg_b, ub[:32], 3)
