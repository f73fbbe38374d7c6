"""The key-layer criterion (method/key_layers.py) against plain re-derivations: the pair scores
by explicit loops over sign vectors, and the choice among pairs and poolings by enumeration."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method import key_layers as kl


def _keys(seed: int, n_groups: int = 6, per: int = 3, L: int = 5, H: int = 16):
    """Centred keys of ``n_groups`` requests in ``per`` phrasings at ``L`` layers: a group centre
    plus noise whose size differs by layer, so layers and poolings separate groups unequally."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), per)
    out = {}
    for pooling, scale in (("last", 0.6), ("mean", 1.2)):
        centre = rng.standard_normal((n_groups, L, H))
        noise = rng.standard_normal((len(groups), L, H)) * (scale * np.linspace(0.3, 2.0, L))[None, :, None]
        out[pooling] = centre[groups] + noise
    return out, groups


def _brute_scores(first: np.ndarray, second: np.ndarray, groups: np.ndarray):
    N, L, _ = first.shape
    acc = np.full((L, L), -np.inf)
    margin = np.full((L, L), -np.inf)
    for a in range(L):
        for b in range(L):
            if a == b:
                continue
            keys = [np.concatenate([np.sign(first[i, a] + 0.0) + (first[i, a] == 0),
                                    np.sign(second[i, b] + 0.0) + (second[i, b] == 0)]) for i in range(N)]
            # each block of +-1 signs at unit norm, the pair at unit norm: cosine = mean of the two
            cos = np.array([[float(keys[i] @ keys[j]) / len(keys[i]) for j in range(N)] for i in range(N)])
            right, sib, rest = 0, [], []
            for i in range(N):
                j = max((j for j in range(N) if j != i), key=lambda j: (cos[i, j], -j))
                right += groups[j] == groups[i]
                for j in range(N):
                    if j != i:
                        (sib if groups[j] == groups[i] else rest).append(cos[i, j])
            acc[a, b] = right / N
            margin[a, b] = np.mean(sib) - np.mean(rest)
    return acc, margin


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_scores_match_a_loop_over_sign_vectors(seed):
    keys, groups = _keys(seed)
    for first, second in (("last", "mean"), ("mean", "mean"), ("last", "last")):
        acc, margin = kl.pair_scores(keys[first], keys[second], groups)
        ref_acc, ref_margin = _brute_scores(keys[first], keys[second], groups)
        np.testing.assert_array_equal(acc, ref_acc)
        finite = np.isfinite(ref_margin)
        np.testing.assert_allclose(margin[finite], ref_margin[finite], rtol=0, atol=1e-12)


def _brute_choice(keys, groups, layers, designs):
    """Every (design, a, b) scored by explicit loops; the documented order: accuracy, margin, the
    shallower deeper layer, the shallower first layer, the earlier design. A design pooled alike
    is one unordered pair, listed deeper layer first."""
    cands = []
    for rank, (pa, pb) in enumerate(designs):
        acc, margin = _brute_scores(keys[pa], keys[pb], groups)
        for a in range(len(layers)):
            for b in range(len(layers)):
                if a == b or (pa == pb and a < b):
                    continue
                cands.append(((acc[a, b], round(margin[a, b], 12), -max(a, b), -min(a, b) if pa == pb else -a, -rank),
                              (layers[a], layers[b], (pa, pb))))
    return max(cands)[1]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_choice_among_pairs_and_poolings_is_the_enumerated_best(seed):
    keys, groups = _keys(seed)
    layers = [1, 2, 3, 4, 5]
    for designs in (kl.DESIGNS[:1], kl.DESIGNS):
        c = kl.best_choice(keys, groups, layers, designs)
        assert (c.last, c.mean, c.pooling) == _brute_choice(keys, groups, layers, designs)


def test_one_design_chooses_as_the_shipped_rule_did():
    """The shipped criterion (one design) sorts (accuracy, margin, -max(a, b), -a) and takes the first."""
    for seed in range(6):
        keys, groups = _keys(seed)
        layers = [3, 4, 5, 6, 7]
        acc, margin = kl.pair_scores(keys["last"], keys["mean"], groups)
        order = sorted(((acc[a, b], margin[a, b], -max(a, b), -a, a, b) for a in range(5) for b in range(5)
                        if a != b), reverse=True)
        c = kl.best_choice(keys, groups, layers)
        assert (c.last, c.mean, c.pooling) == (layers[order[0][4]], layers[order[0][5]], ("last", "mean"))


def test_a_pooling_that_separates_groups_better_is_chosen():
    """Keys whose mean rows carry the groups and whose last rows are noise: the criterion asked
    about poolings picks the mean at both layers; asked about layers only, it cannot."""
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(8), 3)
    centre = rng.standard_normal((8, 4, 32))
    keys = {"mean": centre[groups] + 0.3 * rng.standard_normal((24, 4, 32)),
            "last": rng.standard_normal((24, 4, 32))}
    assert kl.best_choice(keys, groups, [1, 2, 3, 4], kl.DESIGNS).pooling == ("mean", "mean")
    assert kl.best_choice(keys, groups, [1, 2, 3, 4]).pooling == ("last", "mean")
