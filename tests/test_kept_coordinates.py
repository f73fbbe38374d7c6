"""A balanced narrowing (``BankConfig.narrow_rule = "balanced"``): which coordinates it keeps, checked
against a loop over coordinates and answers; the kept set's stored form against a bit-by-bit writer;
and a memory narrowed so, stored and opened again, against the one in RAM."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.memory.bank import MemoryBank
from miita_edge.memory.kept_coordinates import decode_kept, encode_kept, kept_nbytes, order_with_kept
from miita_edge.memory.narrowing import rival_differences
from miita_edge.memory.prototype import BankConfig
from miita_edge.memory.store_format import encoded_size


def _rice_by_hand(places, k):
    """The Rice bits of ascending ``places`` (gap to the previous place minus one), one bit at a time."""
    bits, prev = [], -1
    for p in places:
        g = p - prev - 1
        bits += [1] * (g // 2**k) + [0] + [(g // 2**i) % 2 for i in range(k)]
        prev = p
    return bits


def _stream_by_hand(kept, width):
    """The shortest of the kept or dropped places' Rice codes over every k, as a byte list."""
    dropped = [i for i in range(width) if i not in set(kept)]
    best = None
    for complement, places in ((0, list(kept)), (1, dropped)):
        for k in range(24):
            bits = _rice_by_hand(places, k)
            if best is None or len(bits) < len(best[0]):
                best = (bits, complement, k)
    bits, complement, k = best
    bits = bits + [0] * (-len(bits) % 8)
    return [k | 128 * complement] + [sum(b << i for i, b in enumerate(bits[j:j + 8])) for j in range(0, len(bits), 8)]


@pytest.mark.parametrize("seed", range(40))
def test_kept_places_are_coded_as_written_out_and_read_back(seed):
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, 200))
    n = int(rng.integers(1, width + 1))
    kept = np.sort(rng.choice(width, n, replace=False))
    stream = encode_kept(kept, width)
    assert stream.tolist() == _stream_by_hand(kept.tolist(), width)
    assert kept_nbytes(kept, width) == len(stream)
    assert decode_kept(stream, n, width).tolist() == kept.tolist()


def test_a_stream_it_never_writes_is_a_value_error():
    kept = np.array([0, 3, 9, 40])
    stream = encode_kept(kept, 64)
    for bad, why in ((stream[:1], "shorter"), (np.concatenate([stream, [0]]).astype(np.uint8), "does not end"),
                     (np.array([0x40] + stream[1:].tolist(), np.uint8), "header byte"),
                     (stream.astype(np.int16), "byte stream")):
        with pytest.raises(ValueError, match=why):
            decode_kept(bad, 4, 64)
    with pytest.raises(ValueError, match="past the frame"):
        decode_kept(encode_kept(np.array([100]), 128), 1, 64)
    with pytest.raises(ValueError, match="ascending"):
        encode_kept(np.array([3, 3]), 8)


def test_the_kept_places_come_first_in_the_order():
    base = np.array([5, 2, 7, 0, 1, 6, 3, 4])
    assert order_with_kept(base, np.array([1, 3, 6])).tolist() == [2, 0, 3, 5, 7, 1, 6, 4]


def _bank(rule, H=96, parts=2, seed=0, answers=24, shared=3.0, per=(1, 3), scaled=False):
    """A bank of ``answers`` answers whose keys share a common component (many coordinates of one
    sign in every answer) plus their own, a few examples each, some far enough to be second anchors."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(H * parts)
    cfg = BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True, anchor_fold="ward",
                     narrow_rule=rule)
    scale = rng.uniform(0.2, 2.0, H * parts) if scaled else None
    bank = MemoryBank(cfg, H, np.zeros(H * parts), parts, order, key_scale=scale)
    common = shared * rng.standard_normal(H * parts)
    for j in range(answers):
        own = rng.standard_normal(H * parts)
        for _ in range(int(rng.integers(*per))):
            bank.write(None, [100 + j, 1], common + own + 0.8 * rng.standard_normal(H * parts))
    return bank, order


def _keep_by_loop(bank, m):
    """The balanced rule re-stated: per coordinate, the mean over answers of the share of the answer's
    anchor weight (keys stood for) with a positive bit, p; its worth p(1 - p) times the coordinate's
    size in ``key_scale`` (looked up through the order); drop the least worth, the last among ties.
    Only the coordinates a key stores itself are candidates (not the shared ones)."""
    K = bank.key_stored
    scored = []
    for i in range(K):
        shares = []
        for p in bank.protos:
            w = [float(n) for n in p.anchor_n]
            shares.append(sum(wa for wa, a in zip(w, p.anchors) if a[i] > 0) / sum(w))
        s = sum(shares) / len(shares)
        size = 1.0 if bank.key_scale is None else float(bank.key_scale[bank.key_order[i]])
        scored.append((s * (1 - s) * size, -i))
    dropped = {-i for _, i in sorted(scored)[:K - m]}
    return [i for i in range(K) if i not in dropped]


@pytest.mark.parametrize("scaled", [False, True])
def test_balanced_narrowing_keeps_what_the_loop_keeps_and_the_keys_follow_it(scaled):
    bank, _ = _bank("balanced", scaled=scaled)
    assert (bank.key_scale is not None) == scaled
    assert any(len(p.anchors) > 1 for p in bank.protos)
    for _ in range(5):
        K = bank.key_dim
        before = [p.anchors.copy() for p in bank.protos]
        want = _keep_by_loop(bank, K - 8)
        assert bank.narrow_keys()
        assert bank.key_dim == K - 8
        for p, a in zip(bank.protos, before):
            assert np.array_equal(p.anchors, a[:, want])
    assert bank.key_kept is not None and len(bank.key_kept) == bank.key_dim
    # a query is cut to the same places as the anchors
    raw = np.random.default_rng(9).standard_normal(bank.n_embd * bank.key_parts)
    full = MemoryBank(bank.config, bank.n_embd, np.zeros(len(raw)), bank.key_parts, bank._base_order)
    assert np.allclose(bank.prepare_key(raw) * np.linalg.norm(full.prepare_key(raw)[bank.key_kept]),
                       full.prepare_key(raw)[bank.key_kept], atol=1e-6)


def test_the_shared_coordinates_go_first():
    """Coordinates where every answer has the same sign go before any where answers differ."""
    bank, _ = _bank("balanced", shared=6.0)
    K = bank.key_dim
    share = np.mean([(p.anchors > 0).mean(0) for p in bank.protos], axis=0)
    one_sign = np.flatnonzero((share == 0) | (share == 1))
    assert 8 <= len(one_sign) < K - 8
    bank.narrow_keys()
    assert len(set(bank.key_kept.tolist()) & set(one_sign.tolist())) == len(one_sign) - 8


def test_with_one_answer_balanced_narrowing_is_the_prefix():
    for rule in ("prefix", "balanced"):
        bank, _ = _bank(rule, answers=1, per=(3, 4))
        while bank.narrow_keys():
            pass
        assert bank.key_kept is None and bank.key_dim == 96 // 8 * 8
    prefix, _ = _bank("prefix")
    balanced, _ = _bank("balanced")
    for b in (prefix, balanced):
        b.narrow_keys()
    assert "key_kept" not in prefix.to_arrays() and "key_kept" in balanced.to_arrays()


@pytest.mark.parametrize("rule", ["balanced", "balanced-shared"])
def test_a_balanced_memory_is_stored_exactly_and_opens_as_it_was(rule):
    bank, order = _bank(rule, answers=30)
    budget = encoded_size(bank.to_arrays(), {}) * 2 // 3
    log = bank.repair(budget, lambda b: encoded_size(b.to_arrays(shapes_only=True), {}))
    assert log.narrowed and bank.key_kept is not None
    arrays = bank.to_arrays()
    assert encoded_size(arrays, {}) == encoded_size(bank.to_arrays(shapes_only=True), {}) <= budget
    back = MemoryBank.from_arrays(bank.config, bank.n_embd, arrays, np.zeros(len(order)), bank.key_parts, order)
    assert back.key_kept.tolist() == bank.key_kept.tolist() and back.key_dim == bank.key_dim
    assert np.array_equal(back.key_order, bank.key_order)
    assert np.array_equal(back.packed_anchors(), bank.packed_anchors())
    q = np.random.default_rng(4).standard_normal(len(order))
    assert np.array_equal(back.prepare_key(q), bank.prepare_key(q))
    assert np.array_equal(back.prepare_query(q.astype(np.float32)), bank.prepare_query(q.astype(np.float32)))
    # and narrowing goes on from the stored places after a reopen
    assert np.array_equal(back.key_shared, bank.key_shared) and (len(bank.key_shared) > 0) == (rule != "balanced")
    back.narrow_keys()
    bank.narrow_keys()
    assert back.key_kept.tolist() == bank.key_kept.tolist()
    assert np.array_equal(back.packed_anchors(), bank.packed_anchors())
    with pytest.raises(ValueError, match="no coordinate order"):
        MemoryBank.from_arrays(bank.config, bank.n_embd, arrays, np.zeros(len(order)), bank.key_parts, order,
                               key_narrow=np.eye(len(order), dtype=np.float32))


def test_coordinate_rms_is_each_prepared_coordinates_root_mean_square():
    from miita_edge.method.calibration import coordinate_rms

    rng = np.random.default_rng(2)
    H, parts = 6, 2
    keys, mean = rng.standard_normal((9, H * parts)), rng.standard_normal(H * parts)
    W = rng.standard_normal((H * parts, H * parts))
    for whiten in (None, W):
        rows = []
        for k in keys:
            x = k - mean
            x = np.concatenate([x[b * H:(b + 1) * H] / np.linalg.norm(x[b * H:(b + 1) * H]) for b in range(parts)])
            rows.append(x if whiten is None else whiten @ x)
        want = [np.sqrt(sum(r[i] ** 2 for r in rows) / len(rows)) for i in range(H * parts)]
        assert np.allclose(coordinate_rms(keys, mean, parts, whiten), want)


def test_shared_coordinates_are_the_dropped_first_places_with_the_answers_majority_sign():
    """balanced-shared: a dropped coordinate among the frame's first SHARED_SPAN stays in every key
    with the sign most answers had there when it was dropped (a loop over answers); its place is not
    stored; every key, old or written later or folded, has those signs there."""
    from miita_edge.memory.prototype import SHARED_SPAN

    bank, order = _bank("balanced-shared", H=96, answers=30, shared=6.0)
    want_places, want_signs = [], {}
    for _ in range(6):
        stored = bank.key_stored
        places = np.arange(stored) if bank.key_kept is None else bank.key_kept.copy()
        keep = _keep_by_loop(bank, stored - 8)
        for c in sorted(set(range(stored)) - set(keep)):
            if places[c] < SHARED_SPAN:
                ups = [sum(float(w) for w, a in zip(p.anchor_n, p.anchors) if a[c] > 0) / float(sum(p.anchor_n))
                       for p in bank.protos]
                want_signs[int(places[c])] = 1.0 if sum(ups) / len(ups) >= 0.5 else -1.0
        assert bank.narrow_keys()
    want_places = sorted(want_signs)
    assert want_places and bank.key_stored == 192 - 48
    assert sorted(set(range(SHARED_SPAN)) - set(bank.key_kept.tolist())) == want_places
    assert bank.key_shared.tolist() == [want_signs[p] for p in want_places]
    assert bank.key_dim == bank.key_stored + len(want_places)
    assert np.array_equal(bank.key_order[bank.key_stored:bank.key_dim], bank._base_order[want_places])
    for p in bank.protos:
        assert (p.anchors[:, bank.key_stored:] == bank.key_shared).all()
    rng = np.random.default_rng(11)
    res = bank.write(None, [999, 1], rng.standard_normal(192) * 5)
    assert (bank.protos[res.proto].anchors[:, bank.key_stored:] == bank.key_shared).all()
    # a second example of an answer: its radius is its own key's best cosine to the anchors (its
    # own signs at the shared coordinates, as a query's), not the cosine after the shared signs
    from miita_edge.memory.prototype import quantize_radius
    key = rng.standard_normal(192) * 5
    own = np.where(bank.prepare_key(key) >= 0, 1.0, -1.0)
    p = bank.protos[res.proto]
    want = quantize_radius(max(float(a @ own) / len(own) for a in p.anchors))
    assert (own[bank.key_stored:] != bank.key_shared).any()
    bank.write(None, [999, 1], key)
    assert p.radius == min(1.0, want)
    while bank.prune_one_anchor():
        pass
    for p in bank.protos:
        assert (p.anchors[:, bank.key_stored:] == bank.key_shared).all()
    arrays = bank.to_arrays()
    assert arrays["anchors"].shape[1] == bank.key_stored // 8
    assert len(arrays["key_shared"]) == (len(want_places) + 7) // 8
    with pytest.raises(ValueError, match="one bit for each"):
        MemoryBank.from_arrays(bank.config, bank.n_embd, dict(arrays, key_shared=arrays["key_shared"][:0]),
                               np.zeros(192), 2, order)


def test_rival_worth_is_how_often_an_answer_differs_from_its_nearest_rival():
    """rival-shared (``narrowing.rival_differences``): per coordinate, the share of answers whose majority bit there differs from that of
    the answer nearest to it (fewest differing bits, the first among ties), re-stated with loops."""
    bank, _ = _bank("rival-shared", answers=12)
    K = bank.key_stored
    bits = []
    for p in bank.protos:
        w = [float(n) for n in p.anchor_n]
        bits.append([1 if sum(wa * a[i] for wa, a in zip(w, p.anchors)) >= 0 else -1 for i in range(K)])
    want = [0.0] * K
    for j, b in enumerate(bits):
        dist = [sum(x != y for x, y in zip(b, c)) if r != j else 10**9 for r, c in enumerate(bits)]
        rival = bits[dist.index(min(dist))]
        for i in range(K):
            want[i] += (b[i] != rival[i]) / len(bits)
    assert np.allclose(rival_differences(bank.protos, K), want)
    single, _ = _bank("rival-shared", answers=1)
    assert not rival_differences(single.protos, single.key_stored).any()
