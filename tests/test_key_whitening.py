"""Keys whitened against paraphrase noise (method/key_whitening.py): the math against plain numpy,
the bank's key preparation against a recomputation, and the mechanism on synthetic keys."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.memory.bank import MemoryBank
from miita_edge.method import key_whitening as kw
from miita_edge.method.calibration import key_order
from miita_edge.method.presets import Preset, default_preset, preset_version


def test_within_scatter_is_the_sum_of_outer_products_about_each_group_mean():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((11, 5))
    g = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3])
    want = np.zeros((5, 5))
    for i in range(len(z)):
        d = z[i] - z[g == g[i]].mean(axis=0)
        want += np.outer(d, d)
    np.testing.assert_allclose(kw.within_scatter(z, g), want / len(z), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shrink", [0.1, 0.5, 1.0])
def test_whitening_matrix_is_the_inverse_square_root_of_the_shrunk_scatter(shrink):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((6, 4))
    W = A @ A.T / 4  # rank 4 of 6: singular without the shrinkage
    Ws = (1 - shrink) * W + shrink * np.trace(W) / 6 * np.eye(6)
    M = kw.whitening_matrix(W, shrink)
    np.testing.assert_allclose(M, M.T, atol=1e-12)
    # M Ws M = c I for one c > 0 (the matrix is scaled to unit mean eigenvalue)
    P = M @ Ws @ M
    c = P[0, 0]
    assert c > 0
    np.testing.assert_allclose(P, c * np.eye(6), atol=1e-9 * c)
    np.testing.assert_allclose(np.trace(M) / 6, 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="shrink"):
        kw.whitening_matrix(W, 0.0)


def test_prepared_centres_and_normalises_each_block():
    rng = np.random.default_rng(2)
    raw = rng.standard_normal((3, 8)) * 5
    mean = rng.standard_normal(8)
    got = kw.prepared(raw, mean, 2)
    for i in range(3):
        x = raw[i] - mean
        np.testing.assert_allclose(got[i, :4], x[:4] / np.linalg.norm(x[:4]), rtol=1e-12)
        np.testing.assert_allclose(got[i, 4:], x[4:] / np.linalg.norm(x[4:]), rtol=1e-12)


def test_groups_are_whole_and_unrelated_to_the_calibration_inputs():
    from miita_edge.method.calibration import CALIBRATION_INPUTS

    assert all(len(g) >= 3 for g in kw.GROUPS)
    texts = [t for g in kw.GROUPS for t in g]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & set(CALIBRATION_INPUTS)
    assert len(kw.group_ids()) == len(texts)


@pytest.mark.parametrize("order,key_dim", [(False, 1280), (True, 1280), (True, 900)])
def test_bank_prepares_keys_whitened_before_order_and_cut(order, key_dim):
    """prepare_key against a numpy recomputation (centre, block norms, M, order, cut, unit), and
    prepare_query (native centring, then the same steps) with the same signs."""
    H, parts = 640, 2
    rng = np.random.default_rng(3)
    full = H * parts
    mean = rng.standard_normal(full).astype(np.float32)
    A = rng.standard_normal((full, 40))
    M = kw.whitening_matrix(A @ A.T / 40, 0.3).astype(np.float32)
    o = rng.permutation(full) if order else None
    bank = MemoryBank(default_preset().bank, H, mean, parts, o, key_dim, key_whiten=M)
    for _ in range(4):
        raw = (rng.standard_normal(full) * 3).astype(np.float32)
        x = raw.astype(np.float64) - np.float16(mean).astype(np.float64)
        x = np.concatenate([x[:H] / np.linalg.norm(x[:H]), x[H:] / np.linalg.norm(x[H:])])
        x = M.astype(np.float64) @ x
        if o is not None:
            x = x[o]
        x = x[:key_dim]
        ref = x / np.linalg.norm(x)
        got = bank.prepare_key(raw)
        np.testing.assert_allclose(got, ref, atol=2e-6)
        q = bank.prepare_query(raw)
        assert q.dtype == np.float32 and q.shape == (key_dim,)
        np.testing.assert_allclose(q, got, atol=2e-6)
        big = np.abs(ref) > 1e-4  # signs agree wherever rounding cannot flip them
        np.testing.assert_array_equal((q >= 0)[big], (ref >= 0)[big])
    with pytest.raises(ValueError, match="key_whiten"):
        MemoryBank(default_preset().bank, H, mean, parts, key_whiten=np.eye(H, dtype=np.float32))


def test_key_order_takes_the_spread_of_the_whitened_calibration_keys():
    H = 8
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((16, 2 * H)) * rng.uniform(0.1, 5, 2 * H)
    M = kw.whitening_matrix(np.diag(rng.uniform(0.1, 3, 2 * H)), 0.2)
    order = key_order(keys, 2, M)
    x = keys - keys.mean(0)
    blocks = [x[:, b * H:(b + 1) * H] for b in range(2)]
    z = np.hstack([b / np.linalg.norm(b, axis=1, keepdims=True) for b in blocks]) @ M.T
    for b in range(2):
        std = z[:, b * H:(b + 1) * H].std(0)
        got = order[b * H:(b + 1) * H] - b * H
        assert sorted(got.tolist()) == list(range(H))
        assert np.all(np.diff(std[got]) <= 0)


def _sign_knn(train, ytr, test, k=5):
    S = np.sign(test) @ np.sign(train).T
    idx = np.argsort(-S, axis=1)[:, :k]
    return np.array([np.bincount(ytr[r]).argmax() for r in idx])


def test_whitening_fitted_on_other_requests_finds_a_paraphrase_s_request_more_often():
    """The mechanism, on synthetic keys: requests differ along random directions, phrasings along a
    few strong directions shared by every request. A scatter fitted on *other* requests' phrasings
    must raise the sign-bit nearest-neighbour vote on these; without the shared noise (isotropic
    phrasings) it must not be needed. Fails if the whitening is the identity or inverted."""
    rng = np.random.default_rng(5)
    n, r = 256, 12
    noise_dirs = np.linalg.qr(rng.standard_normal((n, r)))[0]

    def draw(n_req, per):
        means = rng.standard_normal((n_req, n)) * 0.5
        y = np.repeat(np.arange(n_req), per)
        x = means[y] + (rng.standard_normal((len(y), r)) * 3.0) @ noise_dirs.T + rng.standard_normal((len(y), n)) * 0.3
        return x, y

    cal_x, cal_y = draw(30, 4)
    M = kw.whitening_matrix(kw.within_scatter(cal_x, cal_y), 0.1)
    x, y = draw(40, 6)
    tr = np.arange(len(y)) % 6 != 0
    plain = np.mean(_sign_knn(x[tr], y[tr], x[~tr]) == y[~tr])
    white = np.mean(_sign_knn(x[tr] @ M, y[tr], x[~tr] @ M) == y[~tr])
    assert white >= plain + 0.2, (plain, white)


def test_preset_stores_and_checks_its_whitening():
    p = default_preset()
    assert p.key_whitening == "replies"
    p.key_whitening = "paraphrase"
    d = p.to_json()
    assert d["key_whitening"] == "paraphrase"
    assert Preset.from_json(d).key_whitening == "paraphrase"
    assert "key_whitening" not in default_preset().to_json()  # a default memory's manifest is unchanged
    assert preset_version("default", 9).key_whitening == "none"  # memories built before keep their keys
    with pytest.raises(StoreError, match="key_whitening"):
        Preset.from_json({**d, "key_whitening": "pca"})
    with pytest.raises(StoreError, match="center_keys"):
        Preset.from_json({**d, "center_keys": False})


def test_cached_whitening_is_the_computed_one_and_is_read_back(tmp_path, monkeypatch):
    """The cache returns ``whitening_for``'s matrix, reads it back without recomputing, and a
    changed input (another centring vector) never reads the stale file."""
    monkeypatch.setattr(kw, "cache_dir", lambda: tmp_path)
    rng = np.random.default_rng(3)
    raw = rng.standard_normal((len(kw.group_ids()), 16)).astype(np.float32)
    mean = rng.standard_normal(16).astype(np.float32)
    want = kw.whitening_for(raw, mean, 2)
    np.testing.assert_array_equal(kw.cached_whitening_for(raw, mean, 2), want)
    assert len(list(tmp_path.glob("whitening-*.npy"))) == 1
    real = kw.whitening_for
    monkeypatch.setattr(kw, "whitening_for", lambda *a, **k: pytest.fail("recomputed a cached matrix"))
    np.testing.assert_array_equal(kw.cached_whitening_for(raw, mean, 2), want)
    monkeypatch.setattr(kw, "whitening_for", real)
    other = kw.cached_whitening_for(raw, mean + 1.0, 2)
    np.testing.assert_allclose(other, kw.whitening_for(raw, mean + 1.0, 2))
    assert len(list(tmp_path.glob("whitening-*.npy"))) == 2
    # a damaged file is recomputed, not trusted
    for f in tmp_path.glob("whitening-*.npy"):
        f.write_bytes(b"not a matrix")
    np.testing.assert_array_equal(kw.cached_whitening_for(raw, mean, 2), want)


@pytest.mark.parametrize("lengths,want", [([], None), ([3, 40, 40], True), ([16, 2, 30, 9], False),
                                          ([16, 16, 1], True), ([15, 15, 99], False), ([2] * 9, False)])
def test_whiten_replies_decides_by_the_median_answer_length(lengths, want):
    assert kw.whiten_replies(lengths, 16) is want
    assert kw.whiten_replies(lengths) is want  # the default threshold is the reply length, 16 tokens
    if lengths:  # against a plain sort
        s = sorted(lengths)
        med = (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2
        assert kw.whiten_replies(lengths, 16) == (med >= 16)


def test_manifest_keeps_the_decision_in_one_optional_byte():
    from miita_edge.memory import meta

    fields = {"format": meta.FORMAT_V2, "preset": {"name": "default", "version": 10}, "template": "plain",
              "fingerprint": {"sha256": "ab" * 32, "arch": "gemma3", "n_embd": 640, "key_layer": 12},
              "budget": "64KiB", "stream_bytes": 10, "examples": 2, "skipped": 0, "key_whitened": False}
    plain = meta.compact(fields)
    white = meta.compact({**fields, "key_whitened": True})
    assert "w" not in plain and white["w"] == 1
    assert meta.expand(plain, {})["key_whitened"] is False
    assert meta.expand(white, {})["key_whitened"] is True
    assert meta.expand({**plain, "w": "yes"}, {})["key_whitened"] == "yes"  # passed on for the check to name
    from miita_edge.memory.manifest import check_fields

    with pytest.raises(StoreError, match="key_whitened"):
        check_fields("mem", {**meta.expand({**plain, "w": 2}, {}), "prototypes": 0, "anchors": 0})


def test_a_memory_of_replies_whitens_and_one_of_labels_does_not(engine, tmp_path):
    """The default preset decides at the first ingest: replies whiten, labels keep version 9's keys;
    the decision is committed, read back on open, and a refused ingest leaves nothing decided."""
    from miita_edge import Example, Miita
    from miita_edge.errors import BudgetError

    reply = ("You can change your PIN at any of our cash machines: insert the card, choose PIN services, "
             "and enter the new four digits twice.")
    other = ("Card deliveries take up to seven working days; if yours has not come by then, tell us and we "
             "will send a new one for free.")
    replies = [Example(f"how do I change my PIN {i}", reply) for i in range(3)] + \
              [Example(f"my card has not arrived yet {i}", other) for i in range(3)]
    labels = [Example(f"how do I change my PIN {i}", "pin") for i in range(3)] + \
             [Example(f"my card has not arrived yet {i}", "card arrival") for i in range(3)]
    for name, rows, want in (("replies", replies, True), ("labels", labels, False)):
        d = tmp_path / name
        with Miita(engine=engine, memory=d, template="plain") as m:
            assert m.preset.key_whitening == "replies" and m.key_whitened is False
            with pytest.raises(BudgetError):
                m.ingest(rows, budget="8B")  # refused: the decision is rolled back with the rest
            assert m.key_whitened is False and m.bank.key_whiten is None
            m.ingest(rows, budget="none")
            assert m.key_whitened is want and (m.bank.key_whiten is not None) is want
            assert (m.manifest().get("w") == 1) is want
            m.ingest(rows[:1], budget="none")  # a later ingest never changes a decided frame
            assert m.key_whitened is want
            asked = m.ask("how can I change my PIN", max_tokens=4)
        with Miita(engine=engine, memory=d, template="plain") as m:
            assert m.key_whitened is want and (m.bank.key_whiten is not None) is want
            assert m.ask("how can I change my PIN", max_tokens=4).text == asked.text


def test_a_memory_of_labels_is_version_9_s_memory_byte_for_byte(engine, tmp_path):
    """Versions 10 to 12 change nothing for a memory of labels: its committed arrays and its size
    are version 9's, and versions 11 and 12 (which differ from 10 only in what they do with replies
    of 16 tokens or more) answer as version 10, so the tables' v9 cells of label benchmarks stand for
    all three (docs/RESULTS.md)."""
    from miita_edge import Example, Miita
    from miita_edge.method.presets import preset_version

    rows = [Example(f"where is the card I ordered {i}", "card arrival") for i in range(3)] + \
           [Example(f"I was charged twice for one coffee {i}", "double charge") for i in range(3)]
    out, asked = {}, {}
    for version in (9, 10, 11, 12):
        with Miita(engine=engine, memory=tmp_path / f"v{version}", template="plain",
                   preset=preset_version("default", version)) as m:
            m.ingest(rows, budget="none")
            out[version] = (m.bank.to_arrays(), m.nbytes(), m.key_whitened)
            asked[version] = [m.ask(q, max_tokens=4).text for q in ("where is my card", "charged two times?")]
    a9, n9, w9 = out[9]
    assert asked[10] == asked[11] == asked[12]
    for v in (10, 11, 12):
        a, n, w = out[v]
        assert (w9, w) == (False, False) and n9 == n
        assert sorted(a9) == sorted(a)
        for k in a9:
            np.testing.assert_array_equal(a9[k], a[k])
