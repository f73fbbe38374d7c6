"""The key frame rotated onto the principal axes of the model's general prompts
(method/key_axes.py): the rotation against an SVD re-derivation, the bank's narrowed keys against a
plain numpy recomputation, the cache, and a memory that opens with the same frame it was built with."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.memory.bank import MemoryBank
from miita_edge.method import key_axes as ka
from miita_edge.method import key_whitening as kw
from miita_edge.method.presets import Preset, default_preset


def _gram_schmidt_reference(z, order):
    """The basis written out: SVD axes of the centred keys with non-zero singular values, then each
    coordinate of ``order`` minus its projection on the rows so far, kept if anything is left."""
    x = z - z.mean(0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    rows = [r for r, sv in zip(vt, s) if sv ** 2 > 1e-9 * s[0] ** 2]
    n = z.shape[1]
    for i in order:
        if len(rows) == n:
            break
        e = np.zeros(n)
        e[i] = 1.0
        r = e - sum((row @ e) * row for row in rows)
        r -= sum((row @ r) * row for row in rows)  # twice, for rounding
        rows.append(r / np.linalg.norm(r))
    return np.array(rows)


@pytest.mark.parametrize("N,n", [(40, 12), (5, 9)])
def test_principal_axes_are_the_svd_axes_then_the_ordered_coordinates(N, n):
    """Against a plain Gram-Schmidt over the SVD's axes: the same rows up to sign; orthonormal and
    complete; the projected keys' covariance diagonal, falling; the tail carries no variance of the
    prompts when they span less than the key."""
    rng = np.random.default_rng(N)
    z = rng.standard_normal((N, n)) @ np.diag(np.linspace(5, 0.2, n)) @ np.linalg.qr(
        rng.standard_normal((n, n)))[0]
    order = rng.permutation(n)
    R = ka.principal_axes(z, order)
    ref = _gram_schmidt_reference(z, order)
    assert R.shape == ref.shape == (n, n)
    np.testing.assert_allclose(R @ R.T, np.eye(n), atol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(R * ref, axis=1)), 1.0, atol=1e-8)
    rank = min(N - 1, n)
    C = np.cov((z - z.mean(0)) @ R[:rank].T, rowvar=False)
    np.testing.assert_allclose(C, np.diag(np.diag(C)), atol=1e-9)
    assert (np.diff(np.diag(C)) <= 1e-9).all()
    np.testing.assert_allclose((z - z.mean(0)) @ R[rank:].T, 0.0, atol=1e-9)
    assert (R[np.arange(n), np.abs(R).argmax(1)] > 0).all()  # each row's sign: its largest entry positive
    with pytest.raises(ValueError, match="two rows"):
        ka.principal_axes(z[:1])
    with pytest.raises(ValueError, match="permutation"):
        ka.principal_axes(z, order[:-1])


@pytest.mark.parametrize("key_dim", [1280, 104])
def test_a_rotated_bank_keeps_the_first_axes(key_dim):
    """prepare_key and prepare_query against numpy: centre, block norms, rotate, cut, unit."""
    H, parts = 640, 2
    rng = np.random.default_rng(2)
    full = H * parts
    mean = rng.standard_normal(full).astype(np.float32)
    R = ka.principal_axes(rng.standard_normal((60, full)), rng.permutation(full)).astype(np.float32)
    bank = MemoryBank(default_preset().bank, H, mean, parts, None, key_dim, key_whiten=R)
    for _ in range(3):
        raw = (rng.standard_normal(full) * 3).astype(np.float32)
        x = raw.astype(np.float64) - np.float16(mean).astype(np.float64)
        x = np.concatenate([x[:H] / np.linalg.norm(x[:H]), x[H:] / np.linalg.norm(x[H:])])
        x = (R.astype(np.float64) @ x)[:key_dim]
        ref = x / np.linalg.norm(x)
        got = bank.prepare_key(raw)
        np.testing.assert_allclose(got, ref, atol=2e-6)
        q = bank.prepare_query(raw)
        np.testing.assert_allclose(q, got, atol=2e-6)


def test_cached_axes_are_the_computed_ones_follow_the_whitening_and_are_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(ka, "cache_dir", lambda: tmp_path)
    rng = np.random.default_rng(3)
    raw = rng.standard_normal((30, 16)).astype(np.float32)
    mean = rng.standard_normal(16).astype(np.float32)
    z = kw.prepared(raw, mean, 2)
    want = ka.principal_axes(z).astype(np.float32)
    order = rng.permutation(16)
    np.testing.assert_allclose(ka.cached_axes_for(raw, mean, 2, order=order),
                               ka.principal_axes(z, order), atol=1e-6)  # another order: another file
    np.testing.assert_allclose(ka.cached_axes_for(raw, mean, 2), want, atol=1e-6)
    assert len(list(tmp_path.glob("axes-*.npy"))) == 2
    real = ka.principal_axes
    monkeypatch.setattr(ka, "principal_axes", lambda *a: pytest.fail("recomputed cached axes"))
    np.testing.assert_allclose(ka.cached_axes_for(raw, mean, 2), want, atol=1e-6)
    monkeypatch.setattr(ka, "principal_axes", real)
    # whitened first: the axes of the whitened keys, composed with the whitening
    A = rng.standard_normal((16, 16))
    M = (A @ A.T / 16 + np.eye(16)).astype(np.float32)
    got = ka.cached_axes_for(raw, mean, 2, M)
    ref = ka.principal_axes(z @ M.astype(np.float64).T) @ M.astype(np.float64)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert len(list(tmp_path.glob("axes-*.npy"))) == 3
    for f in tmp_path.glob("axes-*.npy"):  # a damaged file is recomputed, not trusted
        f.write_bytes(b"not a matrix")
    np.testing.assert_allclose(ka.cached_axes_for(raw, mean, 2), want, atol=1e-6)


def test_the_preset_checks_its_axes():
    p = default_preset()
    assert p.key_axes == "coordinates"
    p.key_axes = "general"
    p.validate_keys()
    back = Preset.from_json(p.to_json())
    assert back.key_axes == "general"
    p.key_axes = "pca"
    with pytest.raises(StoreError, match="key_axes"):
        p.validate_keys()


def _built(engine, tmp_path, axes):
    """A memory with key frame ``axes`` taught two answers, then opened again: its frame as built,
    as opened, its key width both times, and one answer both times."""
    from miita_edge import Example, Miita

    p = default_preset()
    p.key_axes = axes
    rows = [Example(f"how do I change my PIN {i}", "pin") for i in range(3)] + \
           [Example(f"my card has not arrived yet {i}", "card arrival") for i in range(3)]
    d = tmp_path / "mem"
    with Miita(engine=engine, memory=d, template="plain", preset=p) as m:
        m.ingest(rows, budget="none")
        assert m.bank.key_order is None and m.bank.key_whiten is not None
        built = (m.bank.key_whiten.copy(), m.bank.key_dim, m.ask("how can I change my PIN", max_tokens=4).text)
    with Miita(engine=engine, memory=d, template="plain") as m:
        assert m.preset.key_axes == axes
        opened = (m.bank.key_whiten, m.bank.key_dim, m.ask("how can I change my PIN", max_tokens=4).text)
    return built, opened


def test_a_rotated_memory_opens_with_its_frame(engine, tmp_path):
    """A memory built with the general axes stores keys in that frame (orthonormal, square), keeps
    the setting in its manifest, and answers the same after it is opened again."""
    (R, K, asked), (R2, K2, again) = _built(engine, tmp_path, "general")
    np.testing.assert_allclose(R.astype(np.float64) @ R.T.astype(np.float64), np.eye(len(R)), atol=1e-4)
    np.testing.assert_array_equal(R2, R)
    assert K == K2 == len(R) and again == asked


def test_leading_axes_are_the_principal_axes_then_every_coordinate():
    """The overcomplete frame against the SVD reference: its first rows are the prompts' axes with
    non-zero variance (up to sign, as principal_axes signs them), then the identity's rows in
    ``order``, untouched; a key narrowed to P bits is the axes alone, a full one holds every coordinate."""
    rng = np.random.default_rng(7)
    N, n = 6, 10  # fewer prompts than coordinates: rank N - 1
    z = rng.standard_normal((N, n))
    order = rng.permutation(n)
    F = ka.leading_axes(z, order)
    ref = _gram_schmidt_reference(z, order)
    P = N - 1
    assert F.shape == (P + n, n)
    np.testing.assert_allclose(np.abs(np.sum(F[:P] * ref[:P], axis=1)), 1.0, atol=1e-8)
    np.testing.assert_allclose(F[:P], ka.principal_axes(z, order)[:P], atol=1e-12)
    np.testing.assert_array_equal(F[P:], np.eye(n)[order])


@pytest.mark.parametrize("key_dim", [None, 300, 104])
def test_an_overcomplete_bank_keeps_the_axes_first(key_dim):
    """prepare_key and prepare_query against numpy with a (P + n, n) frame: centre, block norms,
    the frame, cut, unit; the full width is P + n; a frame taller than the key takes no order."""
    H, parts = 64, 2
    rng = np.random.default_rng(4)
    full = H * parts
    mean = rng.standard_normal(full).astype(np.float32)
    F = ka.leading_axes(rng.standard_normal((60, full)), rng.permutation(full)).astype(np.float32)
    assert F.shape == (59 + full, full)
    kd = None if key_dim is None else min(key_dim, len(F))
    bank = MemoryBank(default_preset().bank, H, mean, parts, None, kd, key_whiten=F)
    assert bank.key_dim == (len(F) if kd is None else kd)
    for _ in range(3):
        raw = (rng.standard_normal(full) * 3).astype(np.float32)
        x = raw.astype(np.float64) - np.float16(mean).astype(np.float64)
        x = np.concatenate([x[:H] / np.linalg.norm(x[:H]), x[H:] / np.linalg.norm(x[H:])])
        x = (F.astype(np.float64) @ x)[:bank.key_dim]
        ref = x / np.linalg.norm(x)
        np.testing.assert_allclose(bank.prepare_key(raw), ref, atol=2e-6)
        np.testing.assert_allclose(bank.prepare_query(raw), ref, atol=2e-6)
    with pytest.raises(ValueError, match="order"):
        MemoryBank(default_preset().bank, H, mean, parts, np.arange(full), None, key_whiten=F)
    with pytest.raises(ValueError, match="key_whiten"):
        MemoryBank(default_preset().bank, H, mean, parts, None, None, key_whiten=F[:full - 1])
    with pytest.raises(ValueError, match="key width"):
        MemoryBank(default_preset().bank, H, mean, parts, None, len(F) + 1, key_whiten=F)


def _cached_frame_inputs(tmp_path, monkeypatch, seed):
    """Raw keys of 9 prompts, a centring mean and a coordinate order for a 2-block key of 16, with
    the frame cache in ``tmp_path``; and the generator, for more draws."""
    monkeypatch.setattr(ka, "cache_dir", lambda: tmp_path)
    rng = np.random.default_rng(seed)
    raw = rng.standard_normal((9, 16)).astype(np.float32)
    mean = rng.standard_normal(16).astype(np.float32)
    return raw, mean, rng.permutation(16), rng


def test_cached_leading_axes_are_the_computed_ones(tmp_path, monkeypatch):
    raw, mean, order, _ = _cached_frame_inputs(tmp_path, monkeypatch, 5)
    z = kw.prepared(raw, mean, 2)
    want = ka.leading_axes(z, order)
    got = ka.cached_axes_for(raw, mean, 2, order=order, leading=True)
    assert got.shape == (8 + 16, 16)
    np.testing.assert_allclose(got, want, atol=1e-6)
    monkeypatch.setattr(ka, "leading_axes", lambda *a: pytest.fail("recomputed cached axes"))
    np.testing.assert_allclose(ka.cached_axes_for(raw, mean, 2, order=order, leading=True), want, atol=1e-6)
    # the rotation of the same inputs is another file, not this one read back
    assert ka.cached_axes_for(raw, mean, 2, order=order).shape == (16, 16)




def test_an_overcomplete_memory_opens_with_its_frame_and_width(engine, tmp_path):
    """A memory built with the leading axes stores keys P + n wide, and after it is opened again has
    the same frame and width and answers the same."""
    (F, K, asked), (F2, K2, again) = _built(engine, tmp_path, "leading")
    assert F.shape[0] > F.shape[1] and K == K2 == F.shape[0]
    np.testing.assert_array_equal(F2, F)
    assert again == asked


def _narrow_bank(rng, whiten: bool, H=64, parts=2):
    """A bank of three answers, two keys each (one anchor per key), whose keys hold every coordinate
    in the coordinates' frame (an order, and a square whitening when asked) and move to a leading
    frame when narrowed; with the raw keys and the pieces of a plain numpy preparation."""
    full = H * parts
    mean = rng.standard_normal(full).astype(np.float32)
    order = rng.permutation(full)
    W = None
    if whiten:
        A = rng.standard_normal((full, full))
        W = (np.eye(full) + 0.3 * (A + A.T) / np.sqrt(full)).astype(np.float32)
    F = ka.leading_axes(rng.standard_normal((40, full)), order).astype(np.float32)
    bank = MemoryBank(default_preset().bank, H, mean, parts, order, None, key_whiten=W, key_narrow=F)
    raws = (rng.standard_normal((6, full)) * 3).astype(np.float32)
    for i, raw in enumerate(raws):
        bank.write(np.zeros((0, H), np.float32), np.array([10 + i // 2, 7], np.int32), raw)
    return bank, raws, mean, order, W, F


def _blocks(raw, mean, H):
    x = raw.astype(np.float64) - np.float16(mean).astype(np.float64)
    return np.concatenate([x[:H] / np.linalg.norm(x[:H]), x[H:] / np.linalg.norm(x[H:])])


@pytest.mark.parametrize("whiten", [False, True])
def test_a_bank_moves_to_the_narrow_frame_when_repair_first_narrows_it(whiten):
    """Against numpy: at full width keys are prepared in the coordinates' frame (whitening, order),
    exactly as a bank without a narrow frame prepares them; the first narrowing moves every anchor to
    the first m rows of the narrow frame, and a one-key anchor's bits are then the signs its key gets
    there; an anchor folded from two keys, the signs of the sum of each key's new coordinates over its
    old norm; queries follow the frame (prepare_key and prepare_query); a second narrowing is a prefix."""
    rng = np.random.default_rng(11)
    H = 64
    bank, raws, mean, order, W, F = _narrow_bank(rng, whiten)
    full = 2 * H
    plain = MemoryBank(default_preset().bank, H, mean, 2, order, None, key_whiten=W)
    assert not bank.narrowed and bank.key_dim == full
    for raw in raws[:2]:
        np.testing.assert_allclose(bank.prepare_key(raw), plain.prepare_key(raw), atol=1e-6)
        np.testing.assert_allclose(bank.prepare_query(raw), plain.prepare_query(raw), atol=1e-6)
    assert [len(p.anchors) for p in bank.protos] == [2, 2, 2]
    bank.fold_anchor(bank.protos[2], 1)  # the third answer's two keys become one anchor

    def old_frame(raw):
        x = _blocks(raw, mean, H)
        return (x if W is None else W.astype(np.float64) @ x)[order]

    assert bank.narrow_keys()
    m = full - 8
    assert bank.narrowed and bank.key_dim == m
    new = [F.astype(np.float64)[:m] @ _blocks(r, mean, H) for r in raws]
    for j in range(2):
        for a in range(2):
            np.testing.assert_array_equal(bank.protos[j].anchors[a] > 0, new[2 * j + a] > 0)
    folded = sum(new[i] / np.linalg.norm(old_frame(raws[i])) for i in (4, 5))
    np.testing.assert_array_equal(bank.protos[2].anchors[0] > 0, folded > 0)
    for raw in raws[:3]:
        ref = new[0] if raw is raws[0] else F.astype(np.float64)[:m] @ _blocks(raw, mean, H)
        ref = ref / np.linalg.norm(ref)
        np.testing.assert_allclose(bank.prepare_key(raw), ref, atol=2e-5)
        np.testing.assert_allclose(bank.prepare_query(raw), ref, atol=2e-5)
    before = np.concatenate([p.anchors for p in bank.protos])
    assert bank.narrow_keys() and bank.key_dim == m - 8
    np.testing.assert_array_equal(np.concatenate([p.anchors for p in bank.protos]), before[:, :m - 8])


def test_a_narrowed_bank_opens_in_the_narrow_frame_and_a_wide_one_in_its_coordinates():
    """The frame is not stored: a bank opened with the same matrices is in the narrow frame exactly
    when its stored keys are narrower than every coordinate, and prepares queries as before."""
    rng = np.random.default_rng(12)
    bank, raws, mean, order, W, F = _narrow_bank(rng, False)
    wide = MemoryBank.from_arrays(bank.config, 64, bank.to_arrays(), mean, 2, order, None, F)
    assert not wide.narrowed
    np.testing.assert_allclose(wide.prepare_query(raws[0]), bank.prepare_query(raws[0]), atol=1e-6)
    bank.narrow_keys()
    back = MemoryBank.from_arrays(bank.config, 64, bank.to_arrays(), mean, 2, order, None, F)
    assert back.narrowed and back.key_dim == bank.key_dim
    np.testing.assert_array_equal(back.packed_anchors(), bank.packed_anchors())
    np.testing.assert_allclose(back.prepare_query(raws[1]), bank.prepare_query(raws[1]), atol=1e-6)
    # opened from the store, the sums are the stored bits' estimate: moving it is deterministic
    again = MemoryBank.from_arrays(bank.config, 64, wide.to_arrays(), mean, 2, order, None, F)
    twice = MemoryBank.from_arrays(bank.config, 64, wide.to_arrays(), mean, 2, order, None, F)
    assert again.narrow_keys() and twice.narrow_keys()
    np.testing.assert_array_equal(again.packed_anchors(), twice.packed_anchors())


def test_a_narrow_frame_is_checked():
    rng = np.random.default_rng(13)
    H, full = 64, 128
    F = ka.leading_axes(rng.standard_normal((20, full))).astype(np.float32)
    cfg = default_preset().bank
    with pytest.raises(ValueError, match="key_narrow"):
        MemoryBank(cfg, H, None, 2, None, None, key_narrow=F[:, :-1])
    with pytest.raises(ValueError, match="square frame"):
        MemoryBank(cfg, H, None, 2, None, None, key_whiten=F, key_narrow=F)
    p = default_preset()
    p.key_axes = "narrowed"
    p.validate_keys()
    assert Preset.from_json(p.to_json()).key_axes == "narrowed"


def test_a_narrowed_memory_opens_with_its_frames(engine, tmp_path):
    """A memory of preset key_axes "narrowed" taught without a budget keeps every coordinate in the
    coordinates' frame (a narrow frame beside it, unused), and opens again the same."""
    from miita_edge import Example, Miita

    p = default_preset()
    p.key_axes = "narrowed"
    rows = [Example(f"how do I change my PIN {i}", "pin") for i in range(3)] + \
           [Example(f"my card has not arrived yet {i}", "card arrival") for i in range(3)]
    d = tmp_path / "mem"
    with Miita(engine=engine, memory=d, template="plain", preset=p) as m:
        m.ingest(rows, budget="none")
        assert m.bank.key_narrow is not None and m.bank.key_order is not None and not m.bank.narrowed
        asked = m.ask("how can I change my PIN", max_tokens=4).text
        F = m.bank.key_narrow.copy()
    with Miita(engine=engine, memory=d, template="plain") as m:
        assert m.preset.key_axes == "narrowed" and not m.bank.narrowed
        np.testing.assert_array_equal(m.bank.key_narrow, F)
        assert m.ask("how can I change my PIN", max_tokens=4).text == asked


def test_a_whitened_memory_narrowed_by_its_budget_answers_in_the_narrow_frame(engine, tmp_path):
    """A memory that whitens its keys (so its reach is measured out of sample, on each fold's frame)
    and whose budget narrows them: its keys move to the narrow frame, answering measures the reach
    there, and the memory opens again in that frame with the same width and answer."""
    from miita_edge import Example, Miita

    p = default_preset()
    p.key_axes, p.key_whitening = "narrowed", "paraphrase"
    answers = ["pin", "card arrival", "refund", "exchange rate", "top up", "lost card", "fees", "transfer"]
    rows = [Example(f"question {i} about {a}", a) for a in answers for i in range(2)]
    d = tmp_path / "mem"
    with Miita(engine=engine, memory=d, template="plain", preset=p) as m:
        m.ingest(rows, budget="900B")
        assert m.bank.narrowed and m.bank.key_dim < m.bank.n_embd * m.bank.key_parts
        asked = m.ask("question 1 about refund", max_tokens=4).text
        reach = m.pipeline.index(m.bank, m._entries).reach
        assert 0.0 < reach <= 1.0
        K = m.bank.key_dim
    with Miita(engine=engine, memory=d, template="plain") as m:
        assert m.bank.narrowed and m.bank.key_dim == K
        assert m.ask("question 1 about refund", max_tokens=4).text == asked


def test_unit_rows_have_one_size_over_the_prompts_and_keep_every_sign():
    """Each scaled row, applied to the prompts, has root mean square 1 (written out per row), and a
    key's sign bits in the scaled frame are its bits in the unscaled one."""
    rng = np.random.default_rng(11)
    z = rng.standard_normal((30, 10)) * np.linspace(0.2, 3.0, 10)
    R = ka.leading_axes(z, rng.permutation(10))
    U = ka.unit_rows_of(R, z)
    for i in range(len(R)):
        vals = [float(R[i] @ row) for row in z]
        rms = (sum(v * v for v in vals) / len(vals)) ** 0.5
        np.testing.assert_allclose(U[i], R[i] / rms, rtol=1e-12)
        np.testing.assert_allclose(np.sqrt(np.mean((z @ U[i]) ** 2)), 1.0, rtol=1e-12)
    k = rng.standard_normal((50, 10))
    np.testing.assert_array_equal(np.sign(k @ U.T), np.sign(k @ R.T))
    with pytest.raises(ValueError, match="no size"):
        ka.unit_rows_of(np.vstack([R, np.zeros((1, 10))]), z)


def test_cached_unit_axes_are_scaled_after_the_whitening_and_kept_apart(tmp_path, monkeypatch):
    raw, mean, order, rng = _cached_frame_inputs(tmp_path, monkeypatch, 12)
    W = (np.eye(16) + 0.1 * rng.standard_normal((16, 16))).astype(np.float32)
    zw = kw.prepared(raw, mean, 2) @ W.astype(np.float64).T
    want = ka.unit_rows_of(ka.leading_axes(zw, order), zw) @ W.astype(np.float64)
    got = ka.cached_axes_for(raw, mean, 2, W, order, leading=True, unit=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the unscaled frame of the same inputs is another cache file
    plain = ka.cached_axes_for(raw, mean, 2, W, order, leading=True)
    assert not np.allclose(plain, got)
    np.testing.assert_array_equal(np.sign(plain @ raw[0]), np.sign(got @ raw[0]))


def test_the_preset_checks_its_axes_scale():
    p = default_preset()
    assert p.key_axes_scale == "none"
    p.key_axes, p.key_axes_scale = "narrowed", "unit"
    p.validate_keys()
    back = Preset.from_json(p.to_json())
    assert (back.key_axes, back.key_axes_scale) == ("narrowed", "unit")
    p.key_axes_scale = "eigen"
    with pytest.raises(StoreError, match="key_axes_scale"):
        p.validate_keys()
