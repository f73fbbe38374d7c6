"""The usearch front of the recall scans (method/ann_index.py).

References are brute-force numpy scans written here. Timing is not tested (bench/ann.py).
"""
from __future__ import annotations

import dataclasses

import builtins
import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("usearch", reason='usearch is an optional extra: pip install ".[index]"')

from miita_edge.memory.bank import MemoryBank, Prototype  # noqa: E402
from miita_edge.method import ann_index  # noqa: E402
from miita_edge.method.ann_index import AnnIndex  # noqa: E402
from miita_edge.method.plan import RetrievalIndex, plan_query  # noqa: E402
from miita_edge.method.presets import default_preset  # noqa: E402
from miita_edge.method.retrieval import RetrievalConfig, ScanIndex, retrieve  # noqa: E402

H = 640


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test caches graphs in its own folder."""
    monkeypatch.setenv("MIITA_EDGE_ANN_CACHE", str(tmp_path / "ann"))
    return tmp_path / "ann"


def clustered(n: int, n_centres: int, spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Float rows around random centres (the key distribution of real memories, in miniature)."""
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((n_centres, H))
    X = C[rng.integers(0, n_centres, n)] + spread * rng.standard_normal((n, H))
    return X.astype(np.float32), C


def queries(C: np.ndarray, n: int, spread: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Q = C[rng.integers(0, len(C), n)] + spread * rng.standard_normal((n, H))
    return (Q / np.linalg.norm(Q, axis=1, keepdims=True)).astype(np.float32)


def ref_top(scores: np.ndarray, k: int) -> np.ndarray:
    """Top-k by score, ties to the lower index (the exact path's rule)."""
    return np.lexsort((np.arange(len(scores)), -scores))[:k]


# ----------------------------------------------------------------------------- recall
def test_bit_candidates_contain_the_exact_top_k_on_clustered_keys():
    X, C = clustered(6000, 60, 0.6, 0)
    packed = np.packbits(X >= 0, axis=1)
    signs = np.where(X >= 0, 1.0, -1.0)
    ann = AnnIndex.build(packed, "bits")
    Q = queries(C, 100, 0.6, 1)
    hits = 0
    for q in Q:
        top = ref_top(signs @ q, 8)  # the exact score: the float query against the ±1 anchors
        hits += np.isin(top, ann.candidates(q, 64)).sum()
    assert hits / (8 * len(Q)) >= 0.99


def test_float_candidates_contain_the_exact_top_k_on_clustered_keys():
    X, C = clustered(6000, 60, 0.6, 2)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    ann = AnnIndex.build(U, "f16")
    hits = 0
    for q in queries(C, 100, 0.6, 3):
        hits += np.isin(ref_top(U @ q, 8), ann.candidates(q, 64)).sum()
    assert hits / 800 >= 0.99


def test_duplicate_rows_come_as_a_group():
    rng = np.random.default_rng(4)
    packed = rng.integers(0, 256, (500, 80), dtype=np.uint8)
    packed[[10, 200, 499]] = packed[300]  # four rows share one key
    ann = AnnIndex.build(packed, "bits")
    assert ann.graph.size == 497
    q = np.unpackbits(packed[300]).astype(np.float32) * 2 - 1
    cand = ann.candidates(q, 1)
    assert {10, 200, 300, 499} <= set(cand.tolist())


def test_candidates_are_the_graph_hits_and_every_row_equal_to_one_of_them():
    """Against a brute-force closure: for each row the graph returns, every row byte-equal to it."""
    from miita_edge.method.ann_index import _query_vector

    rng = np.random.default_rng(9)
    packed = rng.integers(0, 256, (600, 80), dtype=np.uint8)
    for group in ([3, 50, 51], [7, 8], [100, 300, 301, 599], [42, 43, 44, 45, 46]):
        packed[group[1:]] = packed[group[0]]
    ann = AnnIndex.build(packed, "bits")
    assert ann.graph.size == 600 - 2 - 1 - 3 - 4
    near_groups = [np.unpackbits(packed[r]).astype(np.float32) * 2 - 1 for r in (3, 100, 42)]
    for q in near_groups + [rng.standard_normal(640).astype(np.float32) for _ in range(20)]:
        ann.graph.expansion_search = 32
        hits = ann.graph.search(_query_vector(q, "bits"), 16, threads=1).keys.astype(np.int64)
        want = sorted({r for h in hits for r in np.flatnonzero((packed == packed[h]).all(axis=1)).tolist()})
        assert ann.candidates(q, 16, 32).tolist() == want


# ----------------------------------------------------------------------------- default preset
def bit_bank(n: int, seed: int = 5) -> tuple[MemoryBank, np.ndarray]:
    X, C = clustered(n, 40, 0.6, seed)
    rng = np.random.default_rng(seed)
    # synthetic prototypes taught once each: without radii (the relevance gate has nothing to read;
    # what is tested here is which anchors retrieval finds)
    cfg = dataclasses.replace(default_preset().bank, relevance=False)
    bank = MemoryBank(cfg, H, np.zeros(H, np.float32))
    for j in range(n):
        a = np.where(X[j] >= 0, 1.0, -1.0).astype(np.float32)[None]
        bank.protos.append(Prototype(np.zeros((0, H), np.float32), rng.integers(1000, 2000, 3).astype(np.int32), a))
    return bank, C


def plan(index, bank, key):
    ids, scores, weights = plan_query(default_preset(), bank, None, index, SimpleNamespace(key=key))[:3]
    return ids, scores, weights


def test_default_preset_selection_equals_the_exact_path_above_the_threshold(monkeypatch):
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    bank, C = bit_bank(3000)
    index = RetrievalIndex.build(bank)
    assert index.ann is not None and index.ann.wait() is not None
    exact = RetrievalIndex.build(bank)
    exact.ann = None
    contained = 0
    for q in queries(C, 60, 0.6, 6):
        a, b = plan(index, bank, q), plan(exact, bank, q)
        s = np.where(np.unpackbits(exact.packed, axis=1) > 0, 1.0, -1.0) @ q
        k = default_preset().k_anchors
        if np.isin(ref_top(s, k), index.ann.ready().propose(q, k)).all():
            contained += 1
            for x, y in zip(a, b):
                assert np.array_equal(x, y)  # bitwise: same ids, scores and weights
    assert contained >= 57


def test_below_the_threshold_the_exact_scan_is_untouched(monkeypatch):
    bank, C = bit_bank(1500)
    assert bank.n_anchors < ann_index.MIN_ROWS
    for cls in (AnnIndex, ann_index.index_class("bits")):
        monkeypatch.setattr(cls, "candidates", lambda *a: pytest.fail("the front was asked below the threshold"))
    index = RetrievalIndex.build(bank)
    assert index.ann is None
    from miita_edge import _native
    from miita_edge.method.steering import knn_prototypes

    for q in queries(C, 5, 0.6, 7):
        u = bank.prepare_query(q)  # the query as retrieval reads it (tests/test_native_types.py checks it)
        p = default_preset()
        ref = knn_prototypes(q, None, index.owner, p.k_anchors, p.retrieval.T_agg, unit_anchors=True,
                             scores=_native.bit_scores(index.packed, u) / np.sqrt(H))
        for x, y in zip(plan(index, bank, q), (ref[0], ref[2], ref[1])):  # plan: ids, scores, weights
            assert np.array_equal(x, y)


def test_without_usearch_bits_use_the_inverted_file_and_float_rows_the_exact_scan(monkeypatch):
    """The default preset's front (packed bits) is the inverted file, which needs no optional
    package; the paper preset's float rows need usearch and fall back to the exact scans."""
    from miita_edge.method.ivf_index import IvfIndex

    bank, C = bit_bank(1500)
    exact = RetrievalIndex.build(bank)  # below the threshold: the exact scan
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    real_import = builtins.__import__

    def no_usearch(name, *args, **kw):
        if name == "usearch" or name.startswith("usearch."):
            raise ImportError("No module named 'usearch'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_usearch)
    assert ann_index.available("bits") and not ann_index.available("f16")
    assert "not installed" in ann_index.status(10**6, "f16")
    assert "inverted-file" in ann_index.status(10**6, "bits")
    assert ann_index.front(np.zeros((10**5, 4), np.float32), "f16", None, "paper-anchors") is None
    index = RetrievalIndex.build(bank)
    assert isinstance(index.ann.wait(), IvfIndex)
    signs = np.where(np.unpackbits(exact.packed, axis=1) > 0, 1.0, -1.0)
    compared = 0
    for q in queries(C, 20, 0.6, 8):
        if np.isin(ref_top(signs @ q, 8), index.ann.ready().propose(q, 8)).all():
            compared += 1
            for x, y in zip(plan(index, bank, q), plan(exact, bank, q)):
                assert np.array_equal(x, y)
    assert compared >= 18


# ----------------------------------------------------------------------------- paper preset
@pytest.mark.parametrize("cone", [0.0, 60.0])
def test_paper_channels_select_what_the_exact_scans_select(monkeypatch, cone):
    """``cone``: a common component of that norm in every key, as in real uncentred keys (any two
    Banking77 keys have cosine ~0.9996): the graph must still see their differences."""
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    monkeypatch.setattr(ann_index, "MIN_ROWS_FLOAT", 100)
    rng = np.random.default_rng(9)
    J = 3000
    A, C = clustered(J, 40, 0.6, 10)
    common = rng.standard_normal(H)
    common *= cone / np.linalg.norm(common)
    A, C = (A + common).astype(np.float32), C + common
    D, _ = clustered(J, 40, 0.6, 11)
    owner = np.arange(J)
    V = 400
    W = rng.standard_normal((V, H)).astype(np.float32)
    cfg = RetrievalConfig()
    with_ann = ScanIndex.build(A, owner, D).attach_ann(None)
    assert all(f is not None and f.wait() is not None for f in with_ann.ann)
    exact = ScanIndex.build(A, owner, D)
    from miita_edge.method.retrieval import restricted_entropy_grad, top_k_restricted, uncertainty_direction

    Au, Du = A / np.linalg.norm(A, axis=1, keepdims=True), D / np.linalg.norm(D, axis=1, keepdims=True)
    compared = sem_found = 0
    for q in queries(C, 30, 0.6, 12):
        logits = rng.standard_normal(V).astype(np.float32) * 3
        a = retrieve(q, A, owner, D, logits, lambda ids: W[ids], cfg, index=with_ann)
        b = retrieve(q, A, owner, D, logits, lambda ids: W[ids], cfg, index=exact)
        ids, p_hat = top_k_restricted(logits, cfg.K_v)  # d_tilde, as retrieve derives it
        _, d_tilde = uncertainty_direction(W[ids].astype(np.float64), restricted_entropy_grad(p_hat)[0], cfg.eps_r)
        u = q / np.linalg.norm(q)
        sem_in = np.isin(ref_top(Au @ u, cfg.R_k), with_ann.ann[0].ready().propose(u, cfg.R_k)).all()
        dir_in = np.isin(ref_top(Du @ d_tilde, cfg.R_d), with_ann.ann[1].ready().propose(d_tilde, cfg.R_d)).all()
        sem_found += sem_in
        if sem_in and dir_in:  # both exact Top_R among the candidates: the selection is the exact one
            compared += 1
            assert np.array_equal(a.ids, b.ids) and np.array_equal(a.candidates, b.candidates)
            assert np.allclose(a.weights, b.weights, rtol=0, atol=1e-6)
    # the key channel's queries lie near the keys; d_tilde here is unrelated to the random
    # directions (a query far from all data, the graph's hard case), so fewer are fully found
    assert sem_found >= 29 and compared >= 20


# ----------------------------------------------------------------------------- cache
def rows_and_entries(seed: int):
    X, C = clustered(2000, 20, 0.6, seed)
    packed = np.packbits(X >= 0, axis=1)
    return packed, {"anchors": {"dtype": "|u1", "shape": list(packed.shape), "crc32": "%08x" % seed, "bytes": 0}}, C


def test_a_graph_is_cached_and_the_next_open_maps_it(monkeypatch, cache):
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    packed, entries, C = rows_and_entries(13)
    first = ann_index.front(packed, "bits", entries, "anchors", background=False)
    assert first.state == "built" and first.path.exists() and first.path.parent == cache
    second = ann_index.front(packed, "bits", entries, "anchors", background=False)
    assert second.state == "cached"
    for q in queries(C, 5, 0.6, 20):
        assert np.array_equal(first.ready().candidates(q, 64), second.ready().candidates(q, 64))


def test_a_new_memory_version_gets_a_new_key(tmp_path):
    from miita_edge.memory.store import Store

    store = Store(tmp_path / "mem")
    packed, _, _ = rows_and_entries(14)
    with store.writer() as w:
        s1 = w.commit({"anchors": packed}, {"m": 1})
    assert store.read().entries == s1.entries and s1.entries["anchors"]["crc32"]
    changed = packed.copy()
    changed[0, 0] ^= 1
    with store.writer() as w:
        s2 = w.commit({"anchors": changed}, {"m": 1})
    k1 = ann_index.content_key(s1.entries, "anchors", "bits", 2000, H)
    k2 = ann_index.content_key(s2.entries, "anchors", "bits", 2000, H)
    assert k1 != k2
    assert ann_index.content_key(None, "anchors", "bits", 2000, H) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "other-rows"])
def test_a_damaged_cache_file_is_rebuilt_with_the_same_answers(monkeypatch, damage):
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    packed, entries, C = rows_and_entries(15)
    good = ann_index.front(packed, "bits", entries, "anchors", background=False)
    path = good.path
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        b = bytearray(raw)
        b[len(b) // 2] ^= 0x40
        path.write_bytes(bytes(b))
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(raw)))
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid file for other rows under this key (a key that lied): the sampled rows differ
        other, _, _ = rows_and_entries(16)
        type(good.ready()).build(other, "bits").save(path, good.key)
    again = ann_index.front(packed, "bits", entries, "anchors", background=False)
    assert again.state == "built"
    signs = np.where(np.unpackbits(packed, axis=1) > 0, 1.0, -1.0)
    for q in queries(C, 10, 0.6, 19):
        cand = again.ready().candidates(q, 64)
        assert np.array_equal(cand, good.ready().candidates(q, 64))  # a one-thread build is deterministic
        assert np.isin(ref_top(signs @ q, 8), cand).all()
    assert ann_index.front(packed, "bits", entries, "anchors", background=False).state == "cached"


def test_concurrent_builders_leave_a_valid_file(monkeypatch):
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    packed, entries, C = rows_and_entries(17)
    fronts = []
    threads = [threading.Thread(target=lambda: fronts.append(
        ann_index.front(packed, "bits", entries, "anchors", background=False))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fronts) == 3 and all(f.ready() is not None for f in fronts)
    reopened = ann_index.front(packed, "bits", entries, "anchors", background=False)
    assert reopened.state == "cached"
    assert not [p for p in reopened.path.parent.iterdir() if p.name.endswith(".tmp")]


def test_background_build_answers_with_the_exact_scan_meanwhile(monkeypatch):
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    gate = threading.Event()
    front_cls = ann_index.index_class("bits")
    real_build = front_cls.build.__func__

    def slow_build(cls, rows, kind, threads=1):
        gate.wait(10)
        return real_build(cls, rows, kind, threads)

    monkeypatch.setattr(front_cls, "build", classmethod(slow_build))
    bank, C = bit_bank(1500)
    index = RetrievalIndex.build(bank)
    assert index.ann.state == "building" and index.ann.ready() is None
    q = queries(C, 1, 0.6, 18)[0]
    during = plan(index, bank, q)
    gate.set()
    assert index.ann.wait(30) is not None and index.ann.state == "built"
    after = plan(index, bank, q)
    for x, y in zip(during, after):
        assert np.array_equal(x, y)


def test_info_counts_the_rows_a_graph_would_index():
    """``miita-edge info`` says whether recall uses the graph: it must count what ``front`` counts
    (the default preset's vote: anchors, then one centroid per answer)."""
    from miita_edge.cli import _graph_rows
    from miita_edge.method.presets import paper_preset, preset_version

    bank, _ = bit_bank(300)
    index = RetrievalIndex.build(bank, centroids=True)
    meta = {"anchors": bank.n_anchors, "prototypes": bank.n_prototypes}
    assert _graph_rows(default_preset(), meta) == index.voters.shape[0] == 600
    assert _graph_rows(preset_version("default", 1), meta) == RetrievalIndex.build(bank).voters.shape[0] == 300
    assert _graph_rows(paper_preset(), {"anchors": 300, "prototypes": 25_000}) == 25_000


def test_float_rows_wait_for_their_own_threshold(monkeypatch):
    """The paper preset's float rows keep MIN_ROWS_FLOAT (its direction channel's recall is short of
    the exact scan's at sizes where 1-bit rows already use the graph); never below MIN_ROWS."""
    rows = np.zeros((300, 8), np.float32)
    monkeypatch.setattr(ann_index, "MIN_ROWS", 100)
    assert ann_index.min_rows("bits") == 100 and ann_index.min_rows("f16") == ann_index.MIN_ROWS_FLOAT > 300
    assert ann_index.front(rows, "f16", None, "paper-anchors") is None
    assert "exact scan" in ann_index.status(300, "f16") and "inverted-file" in ann_index.status(300)
    monkeypatch.setattr(ann_index, "MIN_ROWS_FLOAT", 10)
    assert ann_index.min_rows("f16") == 100


EXIT_WHILE_BUILDING = r"""
import sys, time
import numpy as np
from miita_edge.method import ann_index
ann_index.MIN_ROWS = 100
rows = np.random.default_rng(0).integers(0, 256, (40000, 160), dtype=np.uint8)
front = ann_index.front(rows, "bits", None, "anchors")
assert front is not None and front.state == "building", front and front.state
time.sleep(float(sys.argv[1]))
print("exiting", front.state, flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8])
def test_a_process_that_exits_while_a_graph_builds_exits_cleanly(tmp_path, delay):
    """Found while measuring ingest speed: a process that ended while the background build was inside
    usearch's C++ code was aborted (exit 134, "terminate called without an active exception").
    The build thread is not a daemon now, so the interpreter waits for it at exit."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, MIITA_EDGE_ANN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", EXIT_WHILE_BUILDING, str(delay)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "exiting building" in proc.stdout or "exiting built" in proc.stdout
