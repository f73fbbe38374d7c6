"""The inverted-file front of the default preset's vote (method/ivf_index.py).

References are brute-force numpy recomputations written here; no optional package is needed.
Timing is not tested (bench/ann_breadth.py --ivf-native, bench/ann.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method.ivf_index import IvfIndex, list_count, probe_count, query_code

B = 80  # bytes per row: 640-bit keys


def sign_rows(n: int, centres: int, flip: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed rows: random sign centres with a share ``flip`` of bits flipped (clustered like real
    keys), and the centres as ±1 floats for drawing queries."""
    rng = np.random.default_rng(seed)
    C = rng.random((centres, 8 * B)) < 0.5
    X = C[rng.integers(0, centres, n)] ^ (rng.random((n, 8 * B)) < flip)
    return np.packbits(X, axis=1), np.where(C, 1.0, -1.0)


def masked(rows: np.ndarray, code: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.unpackbits((rows ^ code) & mask, axis=1).sum(axis=1)


def reference_candidates(ivf: IvfIndex, rows: np.ndarray, q: np.ndarray, count: int, nprobe: int) -> np.ndarray:
    """What ``candidates`` must return, recomputed by brute force from the index's lists."""
    code, mask = query_code(q)
    dc = masked(np.asarray(ivf.cent), code, mask)
    lists = np.lexsort((np.arange(len(dc)), dc))[:nprobe]
    pos = np.concatenate([np.arange(ivf.starts[c], ivf.starts[c + 1]) for c in lists])
    d = masked(rows[ivf.order[pos]], code, mask)
    top = ivf.order[pos[np.lexsort((pos, d))][:count]]  # ties: the earlier row in list order
    same = [np.flatnonzero((rows == rows[i]).all(axis=1)) for i in top]  # every identical row
    return np.unique(np.concatenate([top] + same))


def test_query_code_is_the_signs_and_the_stronger_half():
    q = np.array([0.5, -2.0, 0.1, -0.05, 3.0, -0.2, 0.0, 1.0], np.float32)
    code, mask = query_code(q)
    np.testing.assert_array_equal(np.unpackbits(code), q >= 0)
    np.testing.assert_array_equal(np.unpackbits(mask), np.abs(q) >= np.sort(np.abs(q))[4])


def test_lists_hold_every_distinct_row_once_in_its_nearest_list():
    rows, _ = sign_rows(3000, 30, 0.1, 1)
    rows[2500:2600] = rows[:100]  # duplicates are indexed once
    ivf = IvfIndex.build(rows)
    assert len(ivf.cent) == list_count(2900)
    listed = np.sort(np.asarray(ivf.order))
    np.testing.assert_array_equal(listed, np.setdiff1d(np.arange(3000), np.arange(2500, 2600)))
    np.testing.assert_array_equal(ivf.lists, rows[ivf.order])
    D = (np.unpackbits(ivf.lists, axis=1)[:, None, :] != np.unpackbits(ivf.cent, axis=1)[None]).sum(-1)
    owner = np.repeat(np.arange(len(ivf.cent)), np.diff(ivf.starts))
    np.testing.assert_array_equal(owner, D.argmin(axis=1))  # nearest centroid, ties to the lower


@pytest.mark.parametrize("count,nprobe", [(64, 4), (256, 16), (40, 1)])
def test_candidates_match_a_brute_force_recomputation(count, nprobe):
    rows, C = sign_rows(4000, 40, 0.12, 2)
    rows[3900:] = rows[:100]
    ivf = IvfIndex.build(rows)
    rng = np.random.default_rng(3)
    for c in rng.integers(0, len(C), 10):
        q = (C[c] + 0.7 * rng.standard_normal(C.shape[1])).astype(np.float32)
        want = reference_candidates(ivf, rows, q, count, nprobe)
        np.testing.assert_array_equal(ivf.candidates(q, count, nprobe), want)


def test_probing_every_list_for_every_row_returns_all_rows():
    rows, C = sign_rows(1500, 10, 0.2, 4)
    ivf = IvfIndex.build(rows)
    q = C[0].astype(np.float32)
    np.testing.assert_array_equal(ivf.candidates(q, 1500, len(ivf.cent)), np.arange(1500))


def test_default_parameters_keep_the_exact_top_8_on_clustered_keys():
    """Recall of the exact top-8 (the float query against the ±1 rows, the vote's score) among the
    proposed candidates, at the shipped list and probe counts."""
    rows, C = sign_rows(30_000, 300, 0.12, 5)
    ivf = IvfIndex.build(rows)
    S = np.where(np.unpackbits(rows, axis=1) > 0, 1.0, -1.0).astype(np.float32)
    rng = np.random.default_rng(6)
    found = []
    for c in rng.integers(0, len(C), 60):
        q = (C[c] + 0.8 * rng.standard_normal(C.shape[1])).astype(np.float32)
        s = S @ q
        top = np.lexsort((np.arange(len(s)), -s))[:8]
        found.append(np.isin(top, ivf.propose(q, 8)).mean())
    assert np.mean(found) >= 0.99, np.mean(found)


def _twinned_rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rows, C = sign_rows(6000, 40, 0.12, seed)
    rows[5000:5600] = rows[:600]  # twins, as a one-anchor prototype's centroid is its anchor
    rows[5600:5700] = rows[3]  # and one large group of identical rows
    return rows, C


@pytest.mark.parametrize("k", [1, 8, 40, 300])
def test_native_search_equals_its_python_steps_and_a_brute_force_cut(k):
    """``scored_top`` (one native call) against ``scored_top_steps`` (probe, bit_scores, top_rows in
    Python) bitwise, and against a brute-force cut of every proposed row, twins included: the rows
    scoring at least the k-th best, by row; the scores against a dense float64 dot."""
    from miita_edge import _native

    rows, C = _twinned_rows(12)
    ivf = IvfIndex.build(rows)
    root = float(np.sqrt(8 * B))
    S = np.where(np.unpackbits(rows, axis=1) > 0, 1.0, -1.0)
    rng = np.random.default_rng(13)
    queries = [(C[c] + 0.7 * rng.standard_normal(C.shape[1])).astype(np.float32) for c in rng.integers(0, 40, 8)]
    queries.append(np.where(np.unpackbits(rows[3]) > 0, 1.0, -1.0).astype(np.float32))  # the large group on top
    for q in queries:
        q = q / np.linalg.norm(q)
        got = ivf.scored_top(q, k, rows, root)
        for x, y in zip(got, ivf.scored_top_steps(q, k, rows, root)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(ivf.scored_top(q, k, rows, root, threads=2)[0], got[0])
        cand = ivf.propose(q, k)
        s = _native.bit_scores(rows[cand], q).astype(np.float64) / root
        kth = np.sort(s)[::-1][min(k, len(s)) - 1]
        np.testing.assert_array_equal(got[0], cand[s >= kth])
        np.testing.assert_array_equal(got[1], s[s >= kth])
        np.testing.assert_allclose(got[1], S[got[0]] @ q.astype(np.float64) / root, rtol=0, atol=1e-6)
        assert len(got[0]) >= min(k, len(cand))


def test_top_rows_is_the_cut_of_the_expanded_set():
    """DuplicateGroups.top_rows on random scores with exact ties and groups of twins, against
    expanding every key and cutting at the k-th best score."""
    from miita_edge.method.index_files import DuplicateGroups, duplicate_rows

    rng = np.random.default_rng(14)
    rows = rng.integers(0, 256, (400, 2), dtype=np.uint8)
    rows[300:] = rows[:100]
    reps, *dups = duplicate_rows(rows)
    groups = DuplicateGroups(*dups, n_rows=len(rows))
    for _ in range(30):
        keys = rng.choice(reps, 60, replace=False)
        scores = np.round(rng.random(60), 1)  # many exact ties
        k = int(rng.integers(1, 100))
        full = groups.expand(keys)
        score_of = {int(r): sc for r, sc in zip(keys, scores)}
        rep_of = {int(m): int(r) for r in keys for m in groups.expand(np.array([r]))}
        fs = np.array([score_of[rep_of[int(r)]] for r in full])
        kth = np.sort(fs)[::-1][min(k, len(fs)) - 1]
        got_rows, got_scores = groups.top_rows(keys, scores, k)
        np.testing.assert_array_equal(got_rows, full[fs >= kth])
        np.testing.assert_array_equal(got_scores, fs[fs >= kth])
        for x, y in zip(groups.top_rows(keys, scores, k, groups.twins(keys)), (got_rows, got_scores)):
            np.testing.assert_array_equal(x, y)


def test_the_native_search_refuses_arrays_that_do_not_fit():
    from miita_edge import _native

    rows, _ = _twinned_rows(15)
    ivf = IvfIndex.build(rows)
    g, n = ivf.list_twins
    d = ivf.dups
    args = [ivf.cent, ivf.starts, ivf.lists, ivf.order, g, n, d.start, d.members]
    _native.IvfSearch(*args)
    bad = n.copy()
    bad[np.flatnonzero(g >= 0)[0]] = len(d.members) + 1
    with pytest.raises(ValueError, match="outside members"):
        _native.IvfSearch(*args[:5], bad, *args[6:])
    with pytest.raises(ValueError, match="bound"):
        _native.IvfSearch(ivf.cent, ivf.starts[:-1], *args[2:])
    with pytest.raises(ValueError, match="one float per key bit"):
        _native.IvfSearch(*args).search(np.ones(8 * B + 8, np.float32), 1.0, 4, 16, 8)


def test_counts_follow_the_rows():
    assert list_count(100_000) == 1024 and list_count(1_000_000) == 4096 and list_count(10) == 10
    assert probe_count(100_000, 1024) == 84 and probe_count(1_000_000, 4096) == 34
    assert probe_count(1000, 64) == 64  # a small index is read whole


def test_save_load_round_trip_and_damage(tmp_path):
    rows, C = sign_rows(3000, 30, 0.1, 7)
    rows[2900:] = rows[:100]
    ivf = IvfIndex.build(rows)
    path = tmp_path / "x.ivf"
    ivf.save(path, "k1")
    back = IvfIndex.load(path, "k1", rows)
    q = C[3].astype(np.float32)
    np.testing.assert_array_equal(back.candidates(q, 64, 8), ivf.candidates(q, 64, 8))
    for name, a in ivf._arrays():
        np.testing.assert_array_equal(dict(back._arrays())[name], a)
    with pytest.raises(ValueError, match="key"):
        IvfIndex.load(path, "k2", rows)
    other = rows.copy()
    other[np.asarray(ivf.order[0])] ^= 1
    with pytest.raises(ValueError, match="differs"):
        IvfIndex.load(path, "k1", other)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="CRC32"):
        IvfIndex.load(path, "k1", rows)
    path.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(ValueError, match="size"):
        IvfIndex.load(path, "k1", rows)


def test_empty_and_tiny_memories():
    empty = IvfIndex.build(np.zeros((0, B), np.uint8))
    assert empty.candidates(np.ones(8 * B, np.float32), 10).size == 0
    assert all(x.size == 0 for x in empty.scored_top(np.ones(8 * B, np.float32), 8, np.zeros((0, B), np.uint8), 1.0))
    rows, C = sign_rows(5, 2, 0.1, 8)
    np.testing.assert_array_equal(IvfIndex.build(rows).candidates(C[0].astype(np.float32), 256), np.arange(5))
    with pytest.raises(ValueError, match="1-bit"):
        IvfIndex.build(np.zeros((3, 4), np.float32), "f16")


def test_the_front_of_bits_is_the_inverted_file(monkeypatch, tmp_path):
    from miita_edge.method import ann_index

    monkeypatch.setenv("MIITA_EDGE_ANN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    rows, _ = sign_rows(2000, 20, 0.1, 9)
    entries = {"anchors": {"dtype": "|u1", "shape": list(rows.shape), "crc32": "0000abcd"}}
    first = ann_index.front(rows, "bits", entries, "anchors", background=False)
    assert isinstance(first.ready(), IvfIndex) and first.path.suffix == ".ivf" and first.state == "built"
    assert ann_index.front(rows, "bits", entries, "anchors", background=False).state == "cached"
