"""One taught example reaches as far as the model's paraphrases do, and the memory abstains rather
than hand a query to another answer: ``relevance.gate(reach=..., abstain=True)`` and
``relevance.paraphrase_reach``, each against a brute-force re-statement of the rule on synthetic
memories."""
from __future__ import annotations


import numpy as np
import pytest

from miita_edge.method.relevance import EXACT_REPEAT, gate, paraphrase_reach


def reference_keep(best, counts, radius, null, floor, reach, abstain, reach_every=False):
    """The rule in words, one answer at a time: an answer may steer when the query repeats one of
    its examples exactly; or when it was taught at least twice, the query is within its radius and
    beats its null and the query's floor; or when it was taught once (with ``reach_every``: any
    number of times), the query is at least the model's paraphrase reach near its example and
    beats the null and the floor. With ``abstain``, if the answer with the highest best cosine
    (first on ties) may not steer, none may."""
    out = []
    for b, n, r, z in zip(best, counts, radius, null):
        bar = max(z, floor)
        near = reach is not None and b >= reach and b > bar
        if b >= EXACT_REPEAT:
            out.append(True)
        elif n >= 2:
            out.append((b >= r and b > bar) or (reach_every and near))
        else:
            out.append(near)
    lead = int(np.argmax(best))  # numpy's argmax: the first of equal maxima
    if abstain and any(out) and not out[lead]:
        return [False] * len(out)
    return out


@pytest.mark.parametrize("seed", range(200))
def test_gate_equals_the_rule_stated_answer_by_answer(seed):
    rng = np.random.default_rng(seed)
    m, J = int(rng.integers(1, 7)), 12
    ids = rng.choice(J, m, replace=False)
    grid = np.round(np.linspace(0.2, 1.0, 9), 3)  # a coarse grid: ties and exact repeats happen
    best = rng.choice(grid, m)
    counts = rng.integers(1, 4, J)
    radius = rng.choice(grid, J)
    null = rng.choice(grid, J) if rng.random() < 0.7 else None
    floor = float(rng.choice(grid)) if rng.random() < 0.5 else -np.inf
    reach = float(rng.choice(grid)) if rng.random() < 0.7 else None
    abstain = bool(rng.random() < 0.6)
    every = bool(rng.random() < 0.5)
    d = gate(ids, best, counts, radius, null, floor, reach=reach, abstain=abstain, reach_every=every)
    want = reference_keep(best, counts[ids], radius[ids], null[ids] if null is not None else [-np.inf] * m,
                          floor, reach, abstain, every)
    assert d.keep.tolist() == want
    assert (d.reason is None) == any(want)


def test_a_declined_nearest_answer_is_not_replaced_by_a_trusted_farther_one():
    # answer 0 (taught once, query not near enough) is nearest; answer 1 (taught twice) passes alone
    ids, best = np.array([0, 1]), np.array([0.60, 0.55])
    counts, radius = np.array([1, 2]), np.array([1.0, 0.5])
    assert gate(ids, best, counts, radius, reach=0.7).keep.tolist() == [False, True]
    d = gate(ids, best, counts, radius, reach=0.7, abstain=True)
    assert d.keep.tolist() == [False, False] and "not trusted" in d.reason
    # near enough, answer 0 is trusted on one example, and both steer
    assert gate(ids, best, counts, radius, reach=0.6, abstain=True).keep.tolist() == [True, True]


def _bits(v: np.ndarray) -> np.ndarray:
    return np.packbits(v >= 0, axis=1)


def reference_reach(keys: np.ndarray, groups: list[int]) -> float:
    """Every candidate threshold tried against every pair, in plain Python."""
    K = keys.shape[1]
    sign = keys >= 0
    cos = [[(K - 2 * int((sign[i] != sign[j]).sum())) / K for j in range(len(keys))] for i in range(len(keys))]
    sib, non = [], []
    for i in range(len(keys)):
        s = [cos[i][j] for j in range(len(keys)) if j != i and groups[j] == groups[i]]
        o = [cos[i][j] for j in range(len(keys)) if groups[j] != groups[i]]
        if s:
            sib.append(max(s))
        if o:
            non.append(max(o))
    best, best_j = None, None
    for t in sorted(set(sib) | set(non)):
        j = sum(x >= t for x in sib) / len(sib) - sum(x >= t for x in non) / len(non)
        if best_j is None or j > best_j:
            best, best_j = t, j
    return best


@pytest.mark.parametrize("seed", range(20))
def test_paraphrase_reach_is_the_best_separating_threshold(seed):
    rng = np.random.default_rng(seed)
    G, per, K = 8, 3, 64
    centres = rng.standard_normal((G, K))
    keys = np.concatenate([c + rng.uniform(0.3, 1.5) * rng.standard_normal((per, K)) for c in centres])
    groups = [g for g in range(G) for _ in range(per)]
    assert paraphrase_reach(_bits(keys), np.array(groups), K) == pytest.approx(reference_reach(keys, groups))


def test_paraphrase_reach_is_high_for_tight_groups_and_needs_both_kinds_of_pair():
    rng = np.random.default_rng(0)
    K = 128
    centres = rng.standard_normal((6, K))
    tight = np.concatenate([c + 0.05 * rng.standard_normal((3, K)) for c in centres])
    assert paraphrase_reach(_bits(tight), np.repeat(np.arange(6), 3), K) > 0.8
    assert paraphrase_reach(_bits(tight[:3]), np.zeros(3, int), K) == np.inf  # no non-sibling: reaches nothing


def test_sibling_cosines_of_some_rows_are_those_rows_of_all():
    from miita_edge.method.relevance import separating_threshold, sibling_cosines

    rng = np.random.default_rng(5)
    keys = rng.standard_normal((18, 64))
    groups = np.repeat(np.arange(6), 3)
    sib, non = sibling_cosines(_bits(keys), groups, 64)
    rows = groups % 2 == 1
    s1, n1 = sibling_cosines(_bits(keys), groups, 64, rows=rows)
    np.testing.assert_array_equal(s1, sib[rows])
    np.testing.assert_array_equal(n1, non[rows])
    assert separating_threshold(sib, non) == paraphrase_reach(_bits(keys), groups, 64)


def _reference_heldout_reach(raw, groups, mean, parts, H, order, K, shrink):
    """Two folds written out in numpy: whiten by the other fold's within-group scatter (shrunk,
    inverse square root), prepare as the bank does, and separate the held-out fold's nearest
    sibling (own group) from its nearest non-sibling (every other phrasing)."""
    sib, non = [], []
    for fold in (0, 1):
        held = groups % 2 == fold
        z = raw.astype(np.float64) - mean.astype(np.float64)
        z = np.concatenate([z[:, :H] / np.linalg.norm(z[:, :H], axis=1, keepdims=True),
                            z[:, H:] / np.linalg.norm(z[:, H:], axis=1, keepdims=True)], axis=1)
        fit, g = z[~held], groups[~held]
        c = fit - np.stack([fit[g == x].mean(axis=0) for x in g])
        W = c.T @ c / len(fit)
        n = W.shape[0]
        Ws = (1 - shrink) * W + shrink * np.trace(W) / n * np.eye(n)
        e, V = np.linalg.eigh(Ws)
        M = (V / np.sqrt(e)) @ V.T
        k = (z @ M)[:, order][:, :K]
        sign = np.where(k >= 0, 1.0, -1.0)
        cos = sign @ sign.T / K
        for i in np.flatnonzero(held):
            sib.append(max(cos[i, j] for j in range(len(raw)) if j != i and groups[j] == groups[i]))
            non.append(max(cos[i, j] for j in range(len(raw)) if groups[j] != groups[i]))
    best, best_j = None, None
    for t in sorted(set(sib) | set(non)):
        j = sum(x >= t for x in sib) / len(sib) - sum(x >= t for x in non) / len(non)
        if best_j is None or j > best_j:
            best, best_j = t, j
    return best


def test_heldout_reach_of_a_whitened_memory_matches_two_folds_written_out(tmp_path, monkeypatch):
    """pipeline.heldout_reach on a synthetic whitened bank against the folds written out in numpy;
    the folds' matrices are cached, so a second memory version computes no eigendecomposition."""
    from miita_edge.memory.bank import MemoryBank
    from miita_edge.method import key_whitening as kw
    from miita_edge.method import pipeline as pl
    from miita_edge.method.presets import default_preset

    monkeypatch.setattr(kw, "cache_dir", lambda: tmp_path)
    H, parts, K = 24, 2, 40
    rng = np.random.default_rng(11)
    G, per = 12, 3
    groups = np.repeat(np.arange(G), per)
    centres = rng.standard_normal((G, H * parts))
    style = rng.standard_normal((per, H * parts))  # a way of asking shared by every group's n-th phrasing
    raw = (centres[groups] + 1.5 * style[np.tile(np.arange(per), G)]
           + 0.3 * rng.standard_normal((G * per, H * parts))).astype(np.float32)
    mean = np.float16(rng.standard_normal(H * parts) * 0.1).astype(np.float32)
    order = rng.permutation(H * parts)
    M = kw.whitening_for(raw, mean, parts, groups=groups)  # fitted on every group, as a memory's is
    bank = MemoryBank(default_preset().bank, H, mean, parts, order, K, key_whiten=M)
    got = pl.heldout_reach(bank, raw, groups)
    ref = _reference_heldout_reach(raw, groups, bank.key_mean, parts, H, order, K, kw.SHRINK)
    assert got == pytest.approx(ref, abs=1e-12)
    assert len(list(tmp_path.glob("whitening-*.npy"))) == 2  # one matrix per fold
    monkeypatch.setattr(kw, "whitening_for", lambda *a, **k: pytest.fail("recomputed a fold's matrix"))
    assert pl.heldout_reach(bank, raw, groups) == got
    for k in raw[:3]:  # a whitening given in place of the bank's own is applied as the bank's
        np.testing.assert_allclose(bank.prepare_key(k, whiten=M), bank.prepare_key(k), atol=2e-6)


def reference_contested(signs, owner, J, reach):
    """The rule in words, pair by pair: prototype j is contested when one of its anchors and an
    anchor of another prototype have a cosine (mean of the products of their ±1 signs) of at least
    the reach."""
    out = [False] * J
    for a in range(len(signs)):
        for b in range(len(signs)):
            if owner[a] != owner[b] and float(np.mean(signs[a] * signs[b])) >= reach:
                out[owner[a]] = True
    return out


@pytest.mark.parametrize("seed", range(40))
def test_contested_equals_the_pairs_written_out(seed):
    from miita_edge.method.relevance import contested
    rng = np.random.default_rng(seed)
    K, J = int(rng.choice([8, 13, 64])), int(rng.integers(1, 7))
    owner = np.sort(rng.integers(0, J, int(rng.integers(1, 14))))
    base = rng.standard_normal((J, K))
    signs = np.where(base[owner] + rng.standard_normal((len(owner), K)) * rng.choice([0.3, 1.5]) >= 0, 1.0, -1.0)
    reach = float(rng.choice([-1.0, 0.0, 0.25, 0.5, 0.75, 1.0]))
    got = contested(_bits(signs), owner, J, K, reach, chunk=int(rng.integers(1, 5)))
    assert got.tolist() == reference_contested(signs, owner, J, reach)
    assert not contested(_bits(signs), owner, J, K, np.inf).any()


@pytest.mark.parametrize("seed", range(200))
def test_a_contested_answer_is_not_trusted_by_the_reach(seed):
    rng = np.random.default_rng(1000 + seed)
    m, J = int(rng.integers(1, 7)), 12
    ids = rng.choice(J, m, replace=False)
    grid = np.round(np.linspace(0.2, 1.0, 9), 3)
    best = rng.choice(grid, m)
    counts = rng.integers(1, 4, J)
    radius = rng.choice(grid, J)
    null = rng.choice(grid, J)
    reach = float(rng.choice(grid))
    contest = rng.random(J) < 0.5
    abstain = bool(rng.random() < 0.6)
    d = gate(ids, best, counts, radius, null, reach=reach, abstain=abstain, contest=contest)
    # the rule with the contested answers' reach taken away: they pass as answers without a reach would
    want = [keep_r if not contest[j] else keep_0
            for j, keep_r, keep_0 in zip(ids, reference_keep(best, counts[ids], radius[ids], null[ids], -np.inf,
                                                             reach, False),
                                         reference_keep(best, counts[ids], radius[ids], null[ids], -np.inf,
                                                        None, False))]
    lead = int(np.argmax(best))
    if abstain and any(want) and not want[lead]:
        want = [False] * m
    assert d.keep.tolist() == want
    assert (d.reason is None) == any(want)


def test_a_query_between_two_answers_taught_once_alike_is_left_to_the_frozen_model():
    from miita_edge.method.relevance import contested
    # two answers' examples 2 bits apart of 16 (cosine 0.75), a third far from both
    a = np.ones(16)
    b = a.copy(); b[:2] = -1
    c = -a
    signs = np.stack([a, b, c])
    owner = np.array([0, 1, 2])
    contest = contested(_bits(signs), owner, 3, 16, reach=0.7)
    assert contest.tolist() == [True, True, False]
    counts, radius = np.array([1, 1, 1]), np.ones(3)
    d = gate(np.array([0, 1]), np.array([0.875, 0.75]), counts, radius, reach=0.7, abstain=True, contest=contest)
    assert not d.keep.any() and "another answer's example" in d.reason
    # an exact repeat of the contested example still steers; the uncontested answer still reaches
    assert gate(np.array([0]), np.array([1.0]), counts, radius, reach=0.7, contest=contest).keep.tolist() == [True]
    assert gate(np.array([2]), np.array([0.875]), counts, radius, reach=0.7, contest=contest).keep.tolist() == [True]


def _tokens_only(m, text):
    """A query's state as ``ask_tokens`` makes it, with tokens and no text: its key from the memory's key
    prompt, and the model's reading of taught questions (which needs the text) not asked, so the reach's
    own rules are what decide."""
    return m.pipeline.query_state(m.prompt_tokens(text), m.key_tokens(text))


def test_a_real_memory_flags_the_examples_that_share_a_neighbourhood(engine, tmp_path):
    """In a memory, the contested flags are the pairs written out over its stored anchors and reach;
    two questions about one paragraph (different answers, each taught once) share a neighbourhood,
    an unrelated request does not, and a third question about the paragraph steers neither answer."""
    from miita_edge.method.presets import default_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    ctx = ("Context: The old mill on the river was built in 1843 by the Harlow family, who ground wheat there "
           "for three generations before it became a museum. Question: ")
    p = default_preset()
    p.reach_contested = True
    with Miita(engine=engine, memory=tmp_path / "mem", template="plain", preset=p) as m:
        m.ingest([Example(ctx + "When was the mill built?", "1843"),
                  Example(ctx + "Who built the mill?", "the Harlow family"),
                  Example("how do I reset my router password?", "hold the reset button")],
                 budget=None, progress=False)
        index = m.retrieval_index()
        assert index.reach is not None and index.contest is not None
        K = index.key_dim
        signs = np.unpackbits(index.packed, axis=1)[:, :K].astype(np.float64) * 2 - 1
        assert index.contest.tolist() == reference_contested(signs, index.owner, len(index.counts), index.reach)
        assert index.contest.tolist() == [True, True, False]  # ingest order: one prototype per answer
        state = _tokens_only(m, ctx + "What did the family grind there?")
        qp = m.plan(state)
        assert qp.gate is not None and not qp.gate.keep.any() and "another answer's example" in qp.gate.reason
        # without the rule the same memory hands that question to a stored answer of the paragraph
        m.preset.reach_contested = False
        m.pipeline.forget_index()
        qp = m.plan(state)
        assert qp.gate is not None and qp.gate.keep.any()


def reference_margin(best, counts, radius, null, floor, reach, answer, margin):
    """The reach margin in words, over the keep the rule above gives (abstain on): find the answer
    nearest the query (highest best cosine, first on ties); if it may steer, is no exact repeat and
    passes no radius test (it is trusted by the reach alone), and some retrieved prototype of
    another answer has a best cosine less than ``margin`` below it, nothing steers."""
    keep = reference_keep(best, counts, radius, null, floor, reach, True)
    lead = int(np.argmax(best))
    if not keep[lead] or best[lead] >= EXACT_REPEAT:
        return keep
    if counts[lead] >= 2 and best[lead] >= radius[lead] and best[lead] > max(null[lead], floor):
        return keep
    rivals = [best[i] for i in range(len(best)) if answer[i] != answer[lead]]
    if rivals and best[lead] - max(rivals) < margin:
        return [False] * len(keep)
    return keep


@pytest.mark.parametrize("seed", range(300))
def test_reach_margin_equals_the_rule_stated_answer_by_answer(seed):
    rng = np.random.default_rng(1000 + seed)
    m, J = int(rng.integers(1, 7)), 12
    ids = rng.choice(J, m, replace=False)
    grid = np.round(np.linspace(0.2, 1.0, 17), 3)  # steps of 0.05: gaps at, below and above the margin
    best = rng.choice(grid, m)
    counts = rng.integers(1, 3, J)
    radius = rng.choice(grid, J)
    null = rng.choice(grid, J) if rng.random() < 0.5 else None
    floor = float(rng.choice(grid)) if rng.random() < 0.3 else -np.inf
    reach = float(rng.choice(grid[:8]))
    answer_of = rng.integers(0, 4, J)  # several prototypes may share an answer
    margin = float(rng.choice([0.05, 0.1, 0.2]))
    d = gate(ids, best, counts, radius, null, floor, reach=reach, abstain=True, answer=answer_of[ids],
             margin=margin)
    want = reference_margin(best, counts[ids], radius[ids], null[ids] if null is not None else [-np.inf] * m,
                            floor, reach, answer_of[ids], margin)
    assert d.keep.tolist() == want
    assert (d.reason is None) == any(want)
    # margin 0 is the gate without the test
    d0 = gate(ids, best, counts, radius, null, floor, reach=reach, abstain=True, answer=answer_of[ids])
    assert d0.keep.tolist() == reference_keep(best, counts[ids], radius[ids],
                                              null[ids] if null is not None else [-np.inf] * m, floor, reach, True)


def test_a_reached_answer_that_barely_leads_another_is_left_to_the_frozen_model():
    ids, counts, radius = np.array([0, 1, 2]), np.array([1, 1, 2]), np.array([1.0, 1.0, 0.9])
    # answer 0 leads answer 1 by 0.05, both taught once, the query within the reach (0.7) of both
    d = gate(ids, np.array([0.85, 0.80, 0.3]), counts, radius, reach=0.7, abstain=True,
             answer=np.array([0, 1, 2]), margin=0.1)
    assert not d.keep.any() and "leads another answer" in d.reason
    # a lead of 0.15 steers; so does a prototype of the same answer at 0.80, which is no rival
    assert gate(ids, np.array([0.95, 0.80, 0.3]), counts, radius, reach=0.7, abstain=True,
                answer=np.array([0, 1, 2]), margin=0.1).keep.tolist() == [True, True, False]
    assert gate(ids, np.array([0.85, 0.80, 0.3]), counts, radius, reach=0.7, abstain=True,
                answer=np.array([0, 0, 2]), margin=0.1).keep.tolist() == [True, True, False]
    # an exact repeat, and an answer inside its own radius, steer however near a rival comes
    assert gate(ids, np.array([1.0, 0.99, 0.3]), counts, radius, reach=0.7, abstain=True,
                answer=np.array([0, 1, 2]), margin=0.1).keep[0]
    assert gate(np.array([2, 1]), np.array([0.95, 0.90]), counts, radius, reach=0.7, abstain=True,
                answer=np.array([2, 1]), margin=0.1).keep.tolist() == [True, True]


def test_a_real_memory_reads_the_margin_over_its_answers(engine, tmp_path):
    """The plan gives the gate each retrieved prototype's answer (equal answer tokens, one id, as a
    brute-force comparison of the stored token lists says); a margin no lead can clear leaves a
    question within two answers' reach to the frozen model, and an exact repeat still steers."""
    from miita_edge.method.presets import default_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    ctx = ("Context: The old mill on the river was built in 1843 by the Harlow family, who ground wheat there "
           "for three generations before it became a museum. Question: ")
    with Miita(engine=engine, memory=tmp_path / "mem", template="plain", preset=default_preset()) as m:
        m.ingest([Example(ctx + "When was the mill built?", "1843"),
                  Example(ctx + "Who built the mill?", "the Harlow family"),
                  Example(ctx + "In which year was the mill built?", "1843"),
                  Example("how do I reset my router password?", "hold the reset button")],
                 budget=None, progress=False)
        index = m.retrieval_index()
        seqs = [list(map(int, s)) for s in index.seqs]
        ids = index.answer_id()
        assert all((ids[i] == ids[j]) == (seqs[i] == seqs[j]) for i in range(len(seqs)) for j in range(len(seqs)))
        state = _tokens_only(m, ctx + "What did the family grind there?")
        assert m.plan(state).gate.keep.any()  # without a margin a stored answer steers it
        m.preset.reach_margin = 1.99
        m.pipeline.forget_index()
        qp = m.plan(state)
        assert not qp.gate.keep.any() and "leads another answer" in qp.gate.reason
        again = _tokens_only(m, ctx + "Who built the mill?")
        assert m.plan(again).gate.keep.any()
