"""Head-geometry directions and the push (method/head_geometry.py) against independent references,
and the invariance of what a memory does under function-preserving rewrites of a model.

The rewrites are made with gguf-py on tiny generated models with f32 tensors (tests/tiny_gguf.py),
so the rewritten head holds exactly the rewritten numbers and the frozen logits are equal up to
float rounding; a quantised head would add its own rounding to both sides.
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method.head_geometry import HeadGeometry, head_statistics, needed_steps
from miita_edge.method.steering import prefix_direction


def _rand_geometry(H=16, V=200, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(H, H)) * rng.uniform(0.2, 3.0, size=H)  # anisotropic rows
    W = rng.normal(size=(V, H)) @ A + 2.0 * rng.normal(size=H)  # and a large common component
    mu = W.mean(0)
    S = np.cov((W - mu).T, bias=True)
    P = np.linalg.inv(S + 1e-3 * np.trace(S) / H * np.eye(H))
    return W, mu, S, P


def test_direction_is_the_least_covariance_step_of_unit_gain():
    """d_y = argmin dᵀ(Σ+λI)d subject to (W_y − μ)·d = 1, derived here through a Cholesky whitening
    (min ‖u‖ under a·u = 1 is a/‖a‖² in whitened coordinates) instead of the precision matrix."""
    W, mu, S, P = _rand_geometry()
    H = W.shape[1]
    L = np.linalg.cholesky(S + 1e-3 * np.trace(S) / H * np.eye(H))
    geo = HeadGeometry(mu, P, 1.0)
    for y in (0, 7, 123):
        a = np.linalg.solve(L, W[y] - mu)  # L⁻¹c
        u = a / (a @ a)
        ref = np.linalg.solve(L.T, u)
        d = geo.direction(W[y]).astype(np.float64)
        np.testing.assert_allclose(d, ref, rtol=1e-4, atol=1e-7)
        assert abs((W[y] - mu) @ d - 1.0) < 1e-5


def test_direction_respects_the_logit_scale_and_degenerate_rows():
    W, mu, _, P = _rand_geometry()
    d1 = HeadGeometry(mu, P, 1.0, 1.0).direction(W[3])
    d8 = HeadGeometry(mu, P, 1.0, 0.125).direction(W[3])  # logits = W h / 8: eight times the step
    np.testing.assert_allclose(d8, 8 * d1, rtol=1e-5)
    assert not np.any(HeadGeometry(mu, P, 1.0).direction(mu))  # the mean row cannot be raised over itself


def test_direction_raises_the_target_over_heavy_rows():
    """On a head with a common component and unequal norms, the unit head row makes its own token the
    argmax for few rows; the geometry direction for most (a row inside the others' convex hull can
    win along no direction at all, so not for every one)."""
    rng = np.random.default_rng(1)
    V, H = 400, 32
    W = rng.normal(size=(V, H)) * np.exp(rng.normal(0, 0.5, size=(V, 1))) + 3.0 * rng.normal(size=H)
    mu = W.mean(0)
    S = np.cov((W - mu).T, bias=True)
    geo = HeadGeometry(mu, np.linalg.inv(S + 1e-3 * np.trace(S) / H * np.eye(H)), 1.0)
    geo_wins = sum(int(np.argmax(W @ geo.direction(W[y]).astype(np.float64)) == y) for y in range(V))
    row_wins = sum(int(np.argmax(W @ (W[y] / np.linalg.norm(W[y]))) == y) for y in range(V))
    assert row_wins < 0.15 * V  # the failure this module exists for
    assert geo_wins > 0.6 * V


class _Head:
    """The slice of an engine that head_statistics and needed_steps read, over a dense matrix."""

    class _Rows:
        def __init__(self, W):
            self.W = W
            self.head = type("h", (), {"n_vocab": W.shape[0], "n_embd": W.shape[1]})()

        def rows(self, ids):
            return self.W[np.asarray(ids)].astype(np.float32)

    def __init__(self, W):
        self.lm_head = self._Rows(W)


def test_head_statistics_against_numpy(monkeypatch):
    from miita_edge.method import head_geometry as hg

    monkeypatch.setattr(hg, "CHUNK", 64)  # several chunks, one ragged
    W, *_ = _rand_geometry(H=12, V=301, seed=3)
    mu, P = head_statistics(_Head(W))
    np.testing.assert_allclose(mu, W.mean(0), rtol=1e-6, atol=1e-6)
    sample = W[np.concatenate([np.arange(a, min(301, a + 64), hg.COV_STRIDE) for a in range(0, 301, 64)])]
    S = (sample - W.mean(0)).T @ (sample - W.mean(0)) / len(sample)
    ref = np.linalg.inv(S + hg.RIDGE * np.trace(S) / 12 * np.eye(12))
    np.testing.assert_allclose(P, ref, rtol=1e-4, atol=1e-6)


def test_needed_steps_against_a_brute_force_search(monkeypatch):
    """The exact least step t* against the argmax of z + t·W d_y over a dense grid of t."""
    from miita_edge.method import head_geometry as hg

    monkeypatch.setattr(hg, "CHUNK", 50)
    W, mu, _, P = _rand_geometry(H=10, V=120, seed=4)
    rng = np.random.default_rng(5)
    states = rng.normal(size=(4, 10)) * 2
    tokens = [3, 17, 64, 99]
    t = needed_steps(_Head(W), mu, P, states, tokens, logit_mult=0.5)
    geo = HeadGeometry(mu, P, 1.0, 0.5)
    grid = np.linspace(0, 2000, 400001)
    finite = 0
    for s, h in enumerate(states):
        for k, y in enumerate(tokens):
            d = geo.direction(W[y]).astype(np.float64)
            z, g = 0.5 * (W @ h), 0.5 * (W @ d)
            wins = np.argmax(z[None, :] + grid[:, None] * g[None, :], axis=1) == y
            ts = t[s, k]
            if not np.isfinite(ts):
                assert not wins.any(), (s, k)
                continue
            finite += 1
            assert np.argmax(z + (ts + 1e-6 * max(1.0, ts)) * g) == y  # it wins just above t*
            assert not wins[grid < ts - 1e-6 * max(1.0, ts)].any()  # and nowhere below it
    assert finite >= 8  # the brute force compared real steps, not only infeasible pairs


def test_prefix_direction_in_logit_units_gives_the_leading_token_the_full_push():
    seqs = [np.array([5, 6]), np.array([5, 7]), np.array([9])]
    D = {(j, s): np.full(3, 10.0 * j + s) for j in range(3) for s in range(2)}
    d = prefix_direction(1, [5], seqs, np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]),
                         lambda j, s: D[(j, s)], normalize=False)
    np.testing.assert_allclose(d, (0.5 * D[(0, 1)] + 0.3 * D[(1, 1)]) / 0.5, rtol=1e-6)  # 6 leads with 0.5
    seqs2 = [np.array([5, 6]), np.array([5, 6]), np.array([5, 7])]  # two answers share the next token
    d = prefix_direction(1, [5], seqs2, np.array([0, 1, 2]), np.array([0.3, 0.3, 0.4]),
                         lambda j, s: D[(j, s)], normalize=False)
    np.testing.assert_allclose(d, (0.3 * D[(0, 1)] + 0.3 * D[(1, 1)] + 0.4 * D[(2, 1)]) / 0.6, rtol=1e-6)
    assert prefix_direction(1, [9], seqs, np.array([0, 1, 2]), np.ones(3), lambda j, s: D[(j, s)],
                            normalize=False) is None


# ------------------------------------------------------------------ invariance on real llama.cpp


def _rewritten(tmp_path, kind: str):
    """A tiny f32 llama model and, for ``kind``, a function-preserving rewrite of it:
    'shift': untied head, every row plus one vector (the softmax is unchanged);
    'scale': final norm weight times 2, head divided by 2 (the logits are unchanged)."""
    import tiny_gguf

    rng = np.random.default_rng(0)
    tensors = tiny_gguf._tensors("llama", False, rng)
    base = tiny_gguf.write_f32(tmp_path / "base.gguf", "llama", False, tensors=tensors)
    t2 = {k: v.copy() for k, v in tensors.items()}
    if kind == "shift":
        t2["output.weight"] = t2["output.weight"] + rng.normal(size=t2["output.weight"].shape[1]).astype(np.float32)
    else:
        t2["output_norm.weight"] = t2["output_norm.weight"] * 2
        t2["output.weight"] = t2["output.weight"] / 2
    return base, tiny_gguf.write_f32(tmp_path / f"{kind}.gguf", "llama", False, tensors=t2)


@pytest.mark.parametrize("kind", ["shift", "scale"])
def test_memory_answers_are_invariant_to_function_preserving_rewrites(tmp_path, kind, monkeypatch):
    from miita_edge import Example, Miita

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    base, copy = _rewritten(tmp_path, kind)
    words = ["card", "money", "refund", "parcel"]
    train = [Example(f"my {a} and {b} please", f"{b} {a}", None, i)
             for i, (a, b) in enumerate(zip(words, words[1:] + words[:1]))]
    train = train + [Example(f"where is my {a} and {b}", e.output, None, 10 + i)
                     for i, ((a, b), e) in enumerate(zip(zip(words, words[1:] + words[:1]), train))]
    answers = {}
    for name, path in (("base", base), ("copy", copy)):
        with Miita(path, tmp_path / f"mem-{name}", template="plain") as m:
            m.ingest(train, budget="none")
            frozen = [m.ask(e.input, max_tokens=6, adapt=False).text for e in train]
            adapted = [m.ask(e.input, max_tokens=6).text for e in train]
            push = m.geometry().push
        answers[name] = (frozen, adapted, push)
    assert answers["base"][0] == answers["copy"][0]  # the rewrite preserves the model's function
    assert answers["base"][1] == answers["copy"][1]  # and what the memory does with it
    assert answers["base"][2] == pytest.approx(answers["copy"][2], rel=1e-3)
    # the memory did steer (a random model's keys do not retrieve well enough for its answers to be right)
    assert answers["base"][1] != answers["base"][0]
