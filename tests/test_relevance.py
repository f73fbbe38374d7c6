"""The relevance gate, key narrowing, the centroid vote and key order, each against a
brute-force recomputation in plain numpy."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from miita_edge.memory.bank import MIN_KEY_BITS, RADIUS_SCALE, BankConfig, MemoryBank
from miita_edge.method.calibration import key_order
from miita_edge.method.plan import RetrievalIndex, centroid_bits, plan_query
from miita_edge.method.presets import default_preset
from miita_edge.method.relevance import EXACT_REPEAT, gate

H = 64


def _clustered_writes(rng, n_answers=6, per=8, spread=0.6, singletons=3, pairs=0):
    """Keys around one centre per answer (answers as token tuples), plus answers taught once; the
    first ``pairs`` answers are taught exactly twice (the smallest count the gate lets through)."""
    centres = rng.standard_normal((n_answers + singletons, H))
    rows = []
    for a in range(n_answers):
        for _ in range(2 if a < pairs else per):
            rows.append((centres[a] + spread * rng.standard_normal(H), [100 + a, 7]))
    for s in range(singletons):
        rows.append((centres[n_answers + s] + spread * rng.standard_normal(H), [200 + s, 7]))
    order = rng.permutation(len(rows))
    return [rows[i] for i in order], centres


def _bank(relevance=True, shrink=False, H=H, parts=1, order=None, floor=MIN_KEY_BITS):
    cfg = BankConfig(payload="tokens", key_precision="bit", relevance=relevance, shrink_keys=shrink, min_key_bits=floor)
    return MemoryBank(cfg, H, None, key_parts=parts, key_order=order)


def _sign_unit(x):
    s = np.where(np.asarray(x, np.float64) >= 0, 1.0, -1.0)
    return s / np.sqrt(len(s))


def test_radius_is_the_loneliest_examples_similarity_brute_force():
    rng = np.random.default_rng(0)
    rows, _ = _clustered_writes(rng)
    bank = _bank()
    seen: dict[tuple, list[np.ndarray]] = {}  # the reference: stored sign keys per answer, in order
    radius: dict[tuple, float] = {}
    for key, toks in rows:
        bank.write(np.zeros((0, H), np.float32), toks, key)
        t = tuple(toks)
        stored = _sign_unit(bank.prepare_key(key))
        if t in seen:
            anchors = seen[t]
            c = max(float(a @ stored) for a in anchors)
            radius[t] = min(radius.get(t, 1.0), np.floor(c * RADIUS_SCALE + 1e-9) / RADIUS_SCALE)
            if c < bank.config.tau_k:  # a novel key becomes an anchor (eq. 4)
                anchors.append(stored)
        else:
            seen[t] = [stored]
    for p in bank.protos:
        t = tuple(int(x) for x in p.tokens)
        assert p.radius == pytest.approx(radius.get(t, 1.0), abs=1e-12)
        assert (p.radius == 1.0) == (p.n == 1)
    # stored as int8 and read back exactly (RAM mirrors disk)
    back = MemoryBank.from_arrays(bank.config, H, bank.to_arrays())
    assert np.array_equal(back.radii(), bank.radii())
    assert back.to_arrays()["radius"].dtype == np.int8


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gate_decision_equals_a_brute_force_recomputation(seed):
    rng = np.random.default_rng(seed)
    rows, centres = _clustered_writes(rng, pairs=3)
    bank = _bank()
    for key, toks in rows:
        bank.write(np.zeros((0, H), np.float32), toks, key)
    assert sorted(set(bank.counts().tolist()))[:2] == [1, 2]
    pr = default_preset()
    index = RetrievalIndex.build(bank, None, centroids=False)
    A, owner = bank.anchor_matrix()
    counts, radii = bank.counts(), bank.radii()
    decided = {True: 0, False: 0}
    queries = [centres[i % len(centres)] + s * rng.standard_normal(H)
               for i in range(40) for s in (0.3, 3.0)] + [rows[0][0]]  # near, far, and an exact repeat
    for q in queries:
        qp = plan_query(pr, bank, None, index, SimpleNamespace(key=q))
        # brute force: what retrieval found before the gate, and every rule of the gate in float64
        full = plan_query(_no_gate(pr), bank, None, index, SimpleNamespace(key=q))
        qs = _sign_unit(bank.prepare_key(q))
        keep = []
        for j in full.ids:
            best = max(float(a @ qs) for a in A[owner == j] / np.sqrt(bank.key_dim))
            keep.append(best >= EXACT_REPEAT or (counts[j] >= 2 and best >= radii[j] - 1e-6))
        keep = np.array(keep, bool)
        assert np.array_equal(qp.gate.keep, keep)
        assert qp.gate.adapted == bool(keep.any())
        assert np.array_equal(qp.ids, full.ids[keep])
        if keep.any():
            assert np.isclose(qp.weights.sum(), 1.0) and qp.gate.reason is None
        else:
            assert len(qp.ids) == 0 and qp.gate.reason
        decided[qp.gate.adapted] += 1
    assert decided[True] and decided[False]  # both outcomes occur: the test can fail either way
    # an exact repeat of a stored input is always let through, even when taught once
    single = next(k for k, t in rows if t[0] >= 200)
    qp = plan_query(pr, bank, None, index, SimpleNamespace(key=single))
    assert qp.gate.adapted


def _no_gate(pr):
    import dataclasses

    return dataclasses.replace(pr, relevance_gate=False)


def test_gate_reasons():
    d = gate(np.array([0, 1]), np.array([0.5, 0.9]), counts=np.array([1, 1]), radius=np.array([1.0, 1.0]))
    assert not d.adapted and "taught by one example" in d.reason
    d = gate(np.array([0]), np.array([0.2]), counts=np.array([5]), radius=np.array([0.4]))
    assert not d.adapted and "not relevant" in d.reason and "0.200" in d.reason and "0.400" in d.reason
    d = gate(np.array([0, 1]), np.array([0.5, 1.0]), counts=np.array([5, 1]), radius=np.array([0.6, 1.0]))
    assert d.keep.tolist() == [False, True]  # the exact repeat passes, the far recurring answer does not
    assert not gate(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0)).adapted


@pytest.mark.parametrize("layout", ["grouped", "shuffled", "gaps", "singles"])
def test_centroid_bits_is_the_sign_of_the_count_weighted_anchor_sum(layout):
    """Runs of one owner that cross chunk boundaries, owners in any order, prototypes without
    anchors (all +1), one-anchor prototypes (the anchor itself) beside several-anchor ones, counts
    up to the stored maximum."""
    rng = np.random.default_rng(4)
    A, width, J = 300, 77, {"gaps": 14, "singles": 250}.get(layout, 9)
    bits = rng.random((A, width)) < 0.5
    if layout == "gaps":
        owner = np.sort(rng.choice([0, 2, 3, 7, 8, 13], A))
    elif layout == "singles":  # most own one anchor, some several, a few none
        owner = np.sort(np.r_[rng.choice(J, 240, replace=False), rng.choice(J, 60)])
    else:
        owner = np.sort(rng.integers(0, J, A))
    counts = rng.integers(1, 5, A)
    counts[::17] = 65535
    perm = rng.permutation(A) if layout == "shuffled" else np.arange(A)
    got = centroid_bits(np.packbits(bits[perm], axis=1), owner[perm], counts[perm], J, width, chunk=64)
    signs = np.where(bits, 1, -1)
    for j in range(J):
        s = (signs[owner == j] * counts[owner == j, None]).sum(0)
        assert np.array_equal(np.unpackbits(got[j], count=width), (s >= 0).astype(np.uint8))
    assert got.shape == (J, (width + 7) // 8)


def test_narrowed_keys_are_prefixes_and_repair_keeps_every_answer():
    """A budget too small for every answer at full width: repair folds anchors, then narrows the
    keys a byte at a time instead of evicting; the stored keys are the old keys' first coordinates
    (in key order), and queries are prepared at the same width. The floor is lowered below this
    test's 64-bit keys so that the mechanism, not the shipped floor's value, is what is checked."""
    floor = 32
    rng = np.random.default_rng(5)
    rows, centres = _clustered_writes(rng, n_answers=10, per=5, singletons=0)
    order = rng.permutation(H)
    wide = _bank(shrink=True, order=order, floor=floor)
    for key, toks in rows:
        wide.write(np.zeros((0, H), np.float32), toks, key)
    full_arrays = wide.to_arrays()

    def size(b):
        return sum(a.nbytes for a in b.to_arrays(shapes_only=True).values())

    import copy

    bank = copy.deepcopy(wide)
    # folding every answer to one anchor frees its other anchors (8 key bytes and a uint8 count
    # each), the anchors-owned array (one byte per answer) and the last anchor counts (one byte per
    # answer: each one anchor then stands for all of its answer's keys, which counts says)
    one_anchor_each = size(bank) - (bank.n_anchors - bank.n_prototypes) * (8 + 1) - 2 * bank.n_prototypes
    budget = one_anchor_each - 10 * 3  # three bytes of key per answer too many
    log = bank.repair(budget, size)
    assert log.evicted == 0 and bank.n_prototypes == 10 and log.narrowed == 3
    assert bank.key_dim == H - 24 and size(bank) <= budget
    # the survivors' stored bits are prefixes of what they would have been at full width
    ref = copy.deepcopy(wide)
    ref.config = BankConfig(**{**ref.config.__dict__, "shrink_keys": False})
    ref.repair(one_anchor_each, size)
    for p, q in zip(bank.protos, ref.protos):
        assert np.array_equal(p.anchors, q.anchors[:, :H - 24])
    raw = rng.standard_normal(H)
    full_q = ref.prepare_key(raw)
    assert np.allclose(bank.prepare_key(raw), full_q[:H - 24] / np.linalg.norm(full_q[:H - 24]), atol=1e-6)
    # the width survives the store (read from the anchors' shape)
    back = MemoryBank.from_arrays(bank.config, H, bank.to_arrays(), key_order=order)
    assert back.key_dim == H - 24 and np.array_equal(back.anchor_matrix()[0], bank.anchor_matrix()[0])
    assert full_arrays["anchors"].shape[1] == H // 8
    # at the preset's floor it stops narrowing and evicts as before
    tiny = copy.deepcopy(bank)
    log = tiny.repair(size(tiny) - 10 * (tiny.key_dim - floor) // 8 - 1, size)
    assert tiny.key_dim == floor and log.evicted >= 1
    # a float-keyed bank never narrows
    fl = MemoryBank(BankConfig(payload="tokens", key_precision="float32", shrink_keys=True), H)
    assert not fl.narrow_keys()


@pytest.mark.parametrize("floor", [0, 4, 60, -8, True, 64.0])
def test_a_narrowing_floor_that_is_not_whole_bytes_is_refused(floor):
    with pytest.raises(ValueError, match="min_key_bits"):
        _bank(shrink=True, floor=floor)


def test_the_floor_is_the_preset_field_not_a_module_constant():
    """Two banks alike but for ``min_key_bits``: under one budget the lower floor narrows further and
    keeps every answer, the higher one stops at its floor and evicts (the shipped default's floor of
    96 is what a memory that records no floor narrows to)."""
    import copy

    rng = np.random.default_rng(7)
    rows, _ = _clustered_writes(rng, n_answers=10, per=3, singletons=0)

    def size(b):
        return sum(a.nbytes for a in b.to_arrays(shapes_only=True).values())

    got = {}
    for floor in (32, 48):
        b = _bank(shrink=True, floor=floor)
        for key, toks in rows:
            b.write(np.zeros((0, H), np.float32), toks, key)
        got[floor] = b
    b = got[32]  # as the test above: every answer folded to one anchor, then three key bytes too many each
    budget = size(b) - (b.n_anchors - b.n_prototypes) * (H // 8 + 1) - 2 * b.n_prototypes - 10 * 3
    low, high = copy.deepcopy(got[32]), copy.deepcopy(got[48])
    low.repair(budget, size)
    high.repair(budget, size)
    assert low.key_dim == H - 24 < 48 == high.key_dim
    assert low.n_prototypes == 10 > high.n_prototypes
    assert BankConfig().min_key_bits == MIN_KEY_BITS == 96


def test_multi_part_keys_are_normalised_per_layer_block():
    rng = np.random.default_rng(6)
    mean = rng.standard_normal(2 * H).astype(np.float32)
    bank = MemoryBank(BankConfig(payload="tokens", key_precision="bit"), H, mean, key_parts=2)
    raw = rng.standard_normal(2 * H) * np.r_[np.full(H, 100.0), np.ones(H)]  # one layer 100x larger
    x = raw - np.float16(mean).astype(np.float64)
    blocks = [x[:H] / np.linalg.norm(x[:H]), x[H:] / np.linalg.norm(x[H:])]
    ref = np.concatenate(blocks) / np.sqrt(2)
    assert np.allclose(bank.prepare_key(raw), ref, atol=1e-5)
    with pytest.raises(ValueError):
        bank.prepare_key(raw[:H])


def test_key_order_sorts_each_block_by_calibration_spread():
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((16, 2 * H)) * rng.uniform(0.1, 5, 2 * H)
    order = key_order(keys, 2)
    assert sorted(order.tolist()) == list(range(2 * H))
    x = keys - keys.mean(0)
    for b in range(2):
        blk = x[:, b * H:(b + 1) * H]
        blk = blk / np.linalg.norm(blk, axis=1, keepdims=True)
        std = blk.std(0)
        got = order[b * H:(b + 1) * H] - b * H
        assert np.all(np.diff(std[got]) <= 0)  # highest spread first, within the block


def test_null_scores_against_numpy():
    from miita_edge.method.relevance import NULL_Z, null_scores

    rng = np.random.default_rng(0)
    g = rng.uniform(-0.2, 0.4, size=(40, 7))
    want = np.array([max(g[:, j].mean() + NULL_Z * g[:, j].std(), g[:, j].max()) for j in range(7)])
    np.testing.assert_allclose(null_scores(g), want, rtol=1e-12)
    one = np.array([[0.3, -0.1]])  # a single question: its own scores
    np.testing.assert_allclose(null_scores(one), [0.3, -0.1])


def test_the_null_score_closes_the_gate_and_says_why():
    from miita_edge.method.relevance import gate

    ids = np.array([0, 1])
    counts, radius = np.array([3, 3]), np.array([0.1, 0.1])
    best = np.array([0.30, 0.25])
    assert gate(ids, best, counts, radius).keep.tolist() == [True, True]
    d = gate(ids, best, counts, radius, null=np.array([0.35, 0.2]))
    assert d.keep.tolist() == [False, True]
    d = gate(ids, best, counts, radius, null=np.array([0.35, 0.3]))
    assert not d.adapted and "general questions" in d.reason
    assert gate(ids, np.array([1.0, 0.0]), counts, radius, null=np.array([1.0, 1.0])).keep.tolist() == [True, False]


def test_generic_best_against_brute_force():
    """Each generic question's best sign-vector cosine to every prototype's anchors, by the native
    popcount kernel, against numpy over the unpacked ±1 vectors."""
    from miita_edge.method.plan import generic_best

    rng = np.random.default_rng(3)
    K, owner = 80, np.array([0, 0, 1, 2, 2, 2])
    signs = rng.choice([-1, 1], size=(len(owner), K))
    start = np.array([0, 2, 3, 6])
    index = SimpleNamespace(key_dim=K, anchor_start=start, packed=np.packbits(signs > 0, axis=1))
    q = rng.choice([-1, 1], size=(5, K))
    got = generic_best(index, np.packbits(q > 0, axis=1))
    want = np.array([[max(q[g] @ signs[a] / K for a in range(start[j], start[j + 1])) for j in range(3)]
                     for g in range(5)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_uncapped_null_scores_at_another_tail_against_numpy():
    from miita_edge.method.relevance import NEAREST_Z, null_scores

    rng = np.random.default_rng(1)
    g = rng.uniform(-0.2, 0.4, size=(40, 5))
    want = np.array([g[:, j].mean() + NEAREST_Z * g[:, j].std() for j in range(5)])
    np.testing.assert_allclose(null_scores(g, z=NEAREST_Z, cap=False), want, rtol=1e-12)
    assert (null_scores(g, z=NEAREST_Z, cap=False) < null_scores(g)).all()  # 1 in 20 sits below 1 in 1,000


def test_nearest_margin_against_brute_force():
    """The query's cosine to its nearest generic question, from packed bits, plus 1/sqrt(K):
    against numpy over the ±1 vectors, for a K that does not fill its last byte."""
    from miita_edge.method.relevance import nearest_margin

    rng = np.random.default_rng(4)
    for K in (80, 77):
        g = rng.choice([-1, 1], size=(9, K))
        q = rng.choice([-1, 1], size=K)
        q[: K // 2] = g[3, : K // 2]  # one question half-equal to the query: it is the nearest
        want = max(g @ q) / K + 1 / np.sqrt(K)
        got = nearest_margin(np.packbits(q > 0), np.packbits(g > 0, axis=1), K)
        assert got == pytest.approx(want, abs=1e-12)
        assert nearest_margin(np.packbits(g[5] > 0), np.packbits(g > 0, axis=1), K) == pytest.approx(1 + 1 / np.sqrt(K))


def test_the_query_floor_closes_the_gate_for_every_answer():
    from miita_edge.method.relevance import gate

    ids, counts, radius = np.array([0, 1]), np.array([3, 3]), np.array([0.1, 0.1])
    best = np.array([0.30, 0.25])
    assert gate(ids, best, counts, radius, null=np.array([0.2, 0.2]), floor=0.27).keep.tolist() == [True, False]
    d = gate(ids, best, counts, radius, null=np.array([0.2, 0.2]), floor=0.31)
    assert not d.adapted and "general questions" in d.reason
    # an exact repeat passes whatever the floor, as it passes any null
    assert gate(ids, np.array([1.0, 0.25]), counts, radius, floor=1.5).keep.tolist() == [True, False]


@pytest.mark.parametrize("seed", [1, 2])
def test_nearest_question_gate_through_plan_query_against_brute_force(seed):
    """The default preset's gate with each answer's 1-in-20 null and the query's nearest-question
    bar, as plan_query applies it from the index, against every rule recomputed in float64 over
    the unpacked ±1 keys; generic questions near one cluster make the bar decide some queries."""
    from miita_edge.method.plan import generic_best
    from miita_edge.method.relevance import NEAREST_Z, null_scores

    rng = np.random.default_rng(seed)
    rows, centres = _clustered_writes(rng, pairs=3)
    bank = _bank()
    for key, toks in rows:
        bank.write(np.zeros((0, H), np.float32), toks, key)
    pr = default_preset()
    assert pr.null_gate and pr.null_rule == "nearest"
    index = RetrievalIndex.build(bank, None, centroids=False)
    K = bank.key_dim
    generic = [centres[0] + 0.8 * rng.standard_normal(H) for _ in range(3)] + [rng.standard_normal(H) * 3 for _ in range(9)]
    gsig = np.stack([_sign_unit(bank.prepare_key(g)) * np.sqrt(K) for g in generic])  # ±1 rows
    index.generic_packed = np.packbits(gsig > 0, axis=1)
    index.null = null_scores(generic_best(index, index.generic_packed), z=NEAREST_Z, cap=False)
    A, owner = bank.anchor_matrix()
    A = A / np.sqrt(K)
    counts, radii = bank.counts(), bank.radii()
    J = len(counts)
    gb = np.array([[max(float(a @ g) for a in A[owner == j]) / np.sqrt(K) if (owner == j).any() else -np.inf
                    for j in range(J)] for g in gsig])
    null = gb.mean(0) + NEAREST_Z * gb.std(0)
    outcomes = {"kept": 0, "bar": 0}
    for q in [centres[i % len(centres)] + s * rng.standard_normal(H) for i in range(30) for s in (0.3, 1.5)]:
        qp = plan_query(pr, bank, None, index, SimpleNamespace(key=q))
        full = plan_query(_no_gate(pr), bank, None, index, SimpleNamespace(key=q))
        qs = _sign_unit(bank.prepare_key(q))
        bar = max(float(g @ qs) for g in gsig) / np.sqrt(K) + 1 / np.sqrt(K)
        keep, keep_without_bar = [], []
        for j in full.ids:
            best = max(float(a @ qs) for a in A[owner == j])
            base = counts[j] >= 2 and best >= radii[j] - 1e-6 and best > null[j] + 1e-9
            keep.append(best >= EXACT_REPEAT or (base and best > bar + 1e-9))
            keep_without_bar.append(best >= EXACT_REPEAT or base)
        assert qp.gate.keep.tolist() == keep
        outcomes["kept"] += any(keep)
        outcomes["bar"] += any(keep_without_bar) and not any(keep)
    assert outcomes["kept"] and outcomes["bar"]  # the bar itself declines some queries here


def test_a_v8_memory_keeps_its_null_rule_and_a_bad_rule_is_refused():
    """Memories built with v5-v8 open with the per-answer 1-in-1,000 null; only v9 asks the
    nearest-question test; a stored rule this version does not know is a clear error."""
    import dataclasses

    from miita_edge.errors import StoreError
    from miita_edge.method.presets import Preset, preset_version

    v8 = preset_version("default", 8)
    assert (v8.null_gate, v8.null_rule) == (True, "tail")
    assert Preset.from_json(v8.to_json()).null_rule == "tail"
    assert Preset.from_json(default_preset().to_json()).null_rule == "nearest"
    with pytest.raises(StoreError, match="null_rule"):
        dataclasses.replace(default_preset(), null_rule="loose").validate_keys()
