"""Retrieval at 100k-1M prototypes: the recall front (method/ann_index.py: the inverted
file of method/ivf_index.py for the default preset's 1-bit rows, ``--bits-front graph`` for the usearch
graph it replaced; the usearch graph for the paper preset's float rows) against the exact scan, in one run, on memories as the current code writes and opens them.

For each preset, size and key distribution, a synthetic memory is committed to a temporary store
and opened as a user's memory would be (graphs cached in a temporary folder, not the user's). Its
arrays have exactly the names, dtypes and row shapes of a small real memory that this run ingests
first with the facade (store format 2: ``anchor_per``, ``tok_dict``/``tok_idx``/``tok_len``, narrow counts, the
default preset's ``radius``; the run fails if it meets an array it cannot make), and its manifest
is that memory's, with the counts of the synthetic one. Every prototype has one anchor, taught by
two examples (n = 2, so the relevance gate sees recurring answers; radius: the cosine of two keys
of one cluster). With the default preset's centroid vote, a one-anchor prototype's centroid is its
anchor: the exact scan reads 2J rows (``voters``), the graph holds J distinct ones (identical rows
are indexed once), and ``MIN_ROWS`` counts voter rows.

  open       Miita(memory=...) and its first retrieval index (default preset: centroid bits and the
             graph front; paper preset: also the first plan, which builds its scan index): cold (no
             cached graph: it is built on a background thread while the exact scan answers) and
             warm (the graph mapped from the cache)
  build      the graph's build time on its background thread (ann_index.BUILD_THREADS threads)
  retrieval  Miita.plan right after a real prompt pass (a Banking77 test prompt), ANN and exact
             alternated, medians of --reps, as a share of the same run's prompt pass
             (targets: <= 1% at 100k, <= 3% at 1M)
  recall     recall@R: the share of the exact top-k rows (numpy over the exact scores of every
             voter row) among the R candidates the graph proposes, over --queries real Banking77
             test keys (target >= 0.99)
  agreement  queries whose selection (ids, scores, weights) equals the exact path's, both with the
             relevance gate (and its decision) and without it (the vote alone)

Keys are the preset's own: the default preset (version 2) pools the layers the memory records
(12 and 9 on Gemma-3-270M: 1,280 coordinates), centres them, orders the coordinates by the
calibration keys' spread and stores sign bits (``MemoryBank.prepare_key``); the paper preset keeps
float keys of its one layer. Real keys are extracted once through the engine with the memory's key
layers and cached under a tag that names the layers, the BOS rule and the preset version.

Key distributions:
  clustered  the real keys of the 3,075 Banking77 training prompts as centres (default preset:
             prepared sign bits; paper preset: unit keys and directions d = Norm(R_m), extracted
             once with the model and cached); a synthetic key is a centre with a share f of its
             bits flipped, f chosen so that two keys of one centre differ as much as a real key and
             its nearest same-label key (median Hamming distance; --spread pairs: as two real keys
             of one label); paper keys and directions get Gaussian noise matching the median
             cosine the same way
  uniform    random keys and directions: a graph's worst case

    python bench/ann.py                                  # 100k and 1M (default), 100k (paper)
    python bench/ann.py --crossover 10000,20000,40000    # prototypes (voter rows: twice as many)
    python bench/ann.py --paper-fit 300000,500000,1000000
    python bench/ann.py --sizes 100000 --paper-sizes 0 --ef 16 --candidates 8   # a run that misses
    python bench/ann.py --sizes 100000 --modes clustered --paper-sizes 0 --nprobe 1024   # reads every list: misses
    python bench/ann.py --sizes 100000 --modes clustered --paper-sizes 0 --steps 80   # and where plan's time goes
    python bench/ann.py --sizes 20000 --modes clustered --paper-sizes 0 --queries 20 --reps 3   # quickest
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from _report import Target, Targets, add_target_argument, print_header


def targets() -> list[Target]:
    return [Target("share_100k", "<=", 1.0, "%", "Miita.plan / prompt pass, memories up to 100k prototypes"),
            Target("share_1m", "<=", 3.0, "%", "Miita.plan / prompt pass, larger memories"),
            Target("recall", ">=", 0.99, "", "recall@R of the front against the exact top rows")]


# ----------------------------------------------------------------------------- real keys
def _keys_tag(eng, m, data: Path, *parts) -> str:
    from miita_edge.runtime.fingerprint import model_sha256

    pr = m.preset
    ident = [model_sha256(eng.info.path), str(data.resolve()), m.template.name, f"{pr.name}/{pr.version}",
             "L" + "_".join(map(str, m.key_layers)), f"skip_bos={pr.skip_bos}", *map(str, parts)]
    return hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]


def _save(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)


def _extractor(m):
    """A one-thread engine pooling memory ``m``'s key layers: extraction runs once and is cached, and
    on a busy machine one thread does not wait on a second one at every barrier."""
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_threads=1))
    eng.set_key_layers(m.key_layers)
    return eng


def real_keys(eng, m, data: Path, n_test: int):
    """Raw keys of the Banking77 prompts as memory ``m`` (the default preset) pools them: its key
    layers, concatenated ((n, L·H) float32, before ``prepare_key``), its BOS rule; extracted once
    and cached. Returns ({train_raw, test_raw, train_label, test_label}, the test inputs)."""
    from miita_edge.method.calibration import _cache_dir, raw_key
    from miita_edge.streams import read_examples

    train = list(read_examples(data / "train.jsonl"))
    test = list(read_examples(data / "test.jsonl"))[:n_test]
    path = _cache_dir() / "bench" / f"banking77-keys-{_keys_tag(eng, m, data, len(train), len(test))}.npz"
    if path.exists():
        return dict(np.load(path)), [e.input for e in test]
    eng = _extractor(m)
    labels = sorted({e.output for e in train} | {e.output for e in test})
    out = {}
    t0 = time.perf_counter()
    for name, rows in (("train", train), ("test", test)):
        K = []
        for i, e in enumerate(rows):
            K.append(raw_key(eng, m.pipeline.key_template, e.input, m.preset.skip_bos).astype(np.float32))
            if i % 500 == 0:
                print(f"#   keys: {name} {i}/{len(rows)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        out[f"{name}_raw"] = np.stack(K)
        out[f"{name}_label"] = np.array([labels.index(e.output) for e in rows], np.int32)
    eng.close()
    _save(path, out)
    return out, [e.input for e in test]


def paper_examples(eng, m, data: Path) -> dict:
    """Real paper-preset keys and directions of the Banking77 training prompts (eqs. 1-2: the key
    with BOS, d = Norm(R_m)) through memory ``m``'s key layer, extracted once and cached like
    ``real_keys``: ``key`` (n, H) unit, ``dir`` (n, H) unit, ``label`` (n,)."""
    from miita_edge.method.calibration import _cache_dir
    from miita_edge.method.ingest import extract_examples
    from miita_edge.streams import read_examples

    train = list(read_examples(data / "train.jsonl"))
    path = _cache_dir() / "bench" / f"banking77-paper-{_keys_tag(eng, m, data, len(train))}.npz"
    if path.exists():
        return dict(np.load(path))
    eng = _extractor(m)
    labels = sorted({e.output for e in train})
    keys, dirs, labs = [], [], []
    t0 = time.perf_counter()
    for i in range(0, len(train), 64):
        part = train[i:i + 64]
        for e, x in zip(part, extract_examples(eng, m.template, m.preset, part)):
            if x is not None:
                keys.append(x.key / np.linalg.norm(x.key))
                dirs.append(x.R_mean / np.linalg.norm(x.R_mean))
                labs.append(labels.index(e.output))
        print(f"#   paper directions: {i + len(part)}/{len(train)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    eng.close()
    out = {"key": np.array(keys, np.float32), "dir": np.array(dirs, np.float32), "label": np.array(labs, np.int32)}
    _save(path, out)
    return out


def template_memory(eng, preset: str, data: Path, work: Path) -> SimpleNamespace:
    """A small real memory of ``preset`` (6 Banking77 training examples through the facade): what the
    synthetic memories copy. ``m`` the Miita, ``spec`` {array: (dtype, row shape)} as the store holds
    them, ``fields`` the memory's fields in the long form."""
    from miita_edge.memory import meta as meta_mod
    from miita_edge.memory.store import Store
    from miita_edge.miita import Miita
    from miita_edge.streams import read_examples

    path = work / f"template-{preset}"
    m = Miita(engine=eng, memory=path, preset=preset, template="banking77")
    m.ingest(read_examples(data / "train.jsonl")[:6], budget="none", progress=False)
    snap = Store(path).read()
    spec = {n: (a.dtype, tuple(a.shape[1:])) for n, a in snap.arrays.items()}
    return SimpleNamespace(m=m, spec=spec, fields=meta_mod.expand(snap.manifest, snap.arrays))


def same_label_pairs(X: np.ndarray, labels: np.ndarray, fn) -> np.ndarray:
    out = []
    for lab in np.unique(labels):
        Y = X[labels == lab]
        iu = np.triu_indices(len(Y), 1)
        out.append(fn(Y)[iu])
    return np.concatenate(out)


def nearest_same_label(X: np.ndarray, labels: np.ndarray, sim) -> np.ndarray:
    """Each key's similarity ``sim`` to its most similar other key of the same label."""
    out = []
    for lab in np.unique(labels):
        S = sim(X[labels == lab]).astype(np.float64)
        if len(S) > 1:
            np.fill_diagonal(S, -np.inf)
            out.append(S.max(1))
    return np.concatenate(out)


# ----------------------------------------------------------------------------- synthetic memories
def _uniform_bits(rng, n: int, bits: int) -> np.ndarray:
    return np.packbits(rng.random((n, bits), np.float32) < 0.5, axis=1)


def synthetic_arrays(tm: SimpleNamespace, J: int, mode: str, rng, centres, noise, radius: int = 0) -> dict:
    """A memory's stored arrays, as the template memory ``tm`` holds them (same names, dtypes and row
    shapes), for J prototypes with one anchor each, three answer tokens, taught twice (n = 2), and no
    taught input kept as evidence (so the model's reading of taught questions is not part of what is timed).
    ``radius``: each prototype's stored radius (int8, the default preset)."""
    pr = tm.m.preset
    cfg = pr.bank
    out = {}
    for name, (dt, tail) in tm.spec.items():
        if name == "anchors" and cfg.key_precision == "bit":
            bits = tm.m.bank.key_dim
            keys = np.empty((J, (bits + 7) // 8), np.uint8)
            for s in range(0, J, 50_000):
                n = min(50_000, J - s)
                if mode == "uniform":
                    keys[s:s + n] = _uniform_bits(rng, n, bits)
                else:  # a centre's bits, each flipped with probability `noise`
                    c = np.unpackbits(centres[rng.integers(0, len(centres), n)], axis=1, count=bits).astype(bool)
                    keys[s:s + n] = np.packbits(c ^ (rng.random((n, bits), np.float32) < noise), axis=1)
            out[name] = keys
        elif name in ("anchors", "dirs") and dt == np.float32:  # the paper preset's float keys and directions
            H = tail[0]
            X = np.empty((J, H), np.float32)
            (K, Dc), (sk, sd) = centres, noise  # real keys and directions of one example each, and their noise
            src, sig = (K, sk) if name == "anchors" else (Dc, sd)
            for s in range(0, J, 50_000):
                n = min(50_000, J - s)
                if mode == "uniform":
                    x = rng.standard_normal((n, H), np.float32)
                else:  # one real example's key (direction) with its own noise
                    x = src[rng.integers(0, len(src), n)] + sig * rng.standard_normal((n, H), np.float32)
                X[s:s + n] = x / np.linalg.norm(x, axis=1, keepdims=True)
            out[name] = X
        elif name in ("anchor_per", "anchor_count"):
            out[name] = np.ones(J, dt)
        elif name == "counts":
            out[name] = np.full(J, 2, dt)
        elif name == "tok_len":
            out[name] = np.full(J, 3, dt)
        # answers of three tokens drawn from a shared dictionary of 256 ids (as labels share their words),
        # 56 of them past 2^16 where the template memory stores such ids
        elif name == "tok_dict":
            out[name] = np.arange(1000, 1000 + 256 - 56 * ("tok_dict3" in tm.spec), dtype=np.uint16)
        elif name == "tok_dict3":
            ids = np.arange(70_000, 70_056, dtype=np.int64)
            out[name] = np.stack([(ids >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8)
        elif name == "tok_ids":  # the same 256 ids as one Rice-coded list, where the bank writes that
            from miita_edge.memory.token_ids import encode_token_ids
            out[name] = encode_token_ids(np.concatenate([np.arange(1000, 1200), np.arange(70_000, 70_056)]))
        elif name == "tok_idx":
            out[name] = rng.integers(0, 256, 3 * J).astype(np.uint8)
        elif name == "tok_bits":  # the same indices and lengths as one bit stream, where the bank packs them
            from miita_edge.memory.bank_arrays import pack_tokens
            out[name] = pack_tokens(rng.integers(0, 256, 3 * J), np.full(J, 3), 256)
        elif name == "ev_len":  # no taught input kept: retrieval never reads them, only the model's reading does
            out[name] = np.zeros(J, dt)
        elif name == "ev3":
            out[name] = np.zeros((0, 3), dt)
        elif name == "radius":
            out[name] = np.full(J, radius, np.int8)
        else:
            raise SystemExit(f"bench/ann.py cannot make array {name!r} ({dt}, rows {tail}) of a "
                             f"{pr.name}/{pr.version} memory: teach synthetic_arrays the current layout")
    for name, a in out.items():  # exactly what the bank writes now
        dt, tail = tm.spec[name]
        if a.dtype != dt or a.shape[1:] != tail:
            raise SystemExit(f"bench/ann.py made {name} as {a.dtype} rows {a.shape[1:]}; the bank writes {dt} rows {tail}")
    return out


def commit(path: Path, tm: SimpleNamespace, arrays: dict) -> None:
    """Commit ``arrays`` with the template memory's manifest, its counts set to the synthetic ones."""
    from miita_edge.memory import meta as meta_mod
    from miita_edge.memory.store import Store

    n = int(np.asarray(arrays["counts"], np.int64).sum())
    fields = dict(tm.fields, examples=n, skipped=0, stream_bytes=60 * n, budget="none")
    with Store(path).writer() as w:
        w.commit(arrays, meta_mod.compact(fields))


# ----------------------------------------------------------------------------- switches
def fronts(m) -> list:
    idx = m.retrieval_index()
    if idx.scan is not None:
        return [f for f in idx.scan.ann if f is not None]
    return [idx.ann] if idx.ann is not None else []


class Exact:
    """Within the block, retrieval of ``m`` uses the exact scan (the graph fronts set aside)."""

    def __init__(self, m):
        self.idx = m.retrieval_index()

    def __enter__(self):
        self.saved = (self.idx.ann, self.idx.scan.ann if self.idx.scan is not None else None)
        self.idx.ann = None
        if self.idx.scan is not None:
            self.idx.scan.ann = (None, None)

    def __exit__(self, *exc):
        self.idx.ann = self.saved[0]
        if self.idx.scan is not None:
            self.idx.scan.ann = self.saved[1]


def indexed(front) -> int:
    """Rows a front's index holds once (distinct rows): graph nodes, or the inverted file's lists."""
    ix = front.ready()
    return int(ix.graph.size) if hasattr(ix, "graph") else int(ix.lists.shape[0])


def apply_overrides(m, ef: int | None, nprobe: int | None = None) -> None:
    for f in fronts(m):
        if f.ready() is not None and ef and hasattr(f.ready(), "ef"):
            f.ready().ef = ef  # the graph's search breadth, instead of the candidate count
        if f.ready() is not None and nprobe and hasattr(f.ready(), "nprobe"):
            f.ready().nprobe = nprobe  # the inverted file's probed lists, instead of SCAN_ROWS' share


# ----------------------------------------------------------------------------- measurements
def ref_top(s: np.ndarray, k: int) -> np.ndarray:
    """Top-k, ties to the lower index (the exact path's rule), by one partition and a sort."""
    if len(s) > 4 * k:
        kth = np.partition(s, len(s) - k)[len(s) - k]
        cand = np.flatnonzero(s >= kth)
        return cand[np.lexsort((cand, -s[cand]))][:k]
    return np.lexsort((np.arange(len(s)), -s))[:k]


def open_memory(eng, path: Path, toks) -> tuple:
    """Open a memory and make its first plan ready; returns (Miita, seconds by step). The paper
    preset's first plan builds its scan index: its prompt pass (``toks``) is not counted."""
    from miita_edge.miita import Miita

    t0 = time.perf_counter()
    m = Miita(engine=eng, memory=path)
    t1 = time.perf_counter()
    m.retrieval_index()
    t2 = time.perf_counter()
    if m.preset.aggregation == "paper":
        st0 = m.keyed_engine().query(toks, skip_bos_in_key=m.preset.skip_bos)
        t2b = time.perf_counter()
        m.plan(st0)  # builds the scan index and its graph fronts
        t2 += time.perf_counter() - t2b
    return m, {"miita": t1 - t0, "index": t2 - t1, "total": t2 - t0}


def retrieval_share(m, eng, prompts: list, reps: int) -> dict:
    """Medians of prompt pass and Miita.plan (ANN and exact alternated, each after its own pass).
    The prompt pass is the answer's alone: a memory that keys queries by a prompt of their own
    (``Preset.key_prompt``) spends a key-only pass more, so the share printed overstates retrieval's."""
    m.keyed_engine()  # the memory's key layers (an engine shared by memories of both presets)
    times = {"prompt": [], "ann": [], "exact": []}
    for r in range(reps):
        toks = prompts[r % len(prompts)]
        for path in (("ann", "exact") if r % 2 == 0 else ("exact", "ann")):
            t0 = time.perf_counter()
            st = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
            t1 = time.perf_counter()
            if path == "exact":
                with Exact(m):
                    m.plan(st)
            else:
                m.plan(st)
            t2 = time.perf_counter()
            times["prompt"].append(t1 - t0)
            times[path].append(t2 - t1)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def plan_steps(m, eng, prompts: list, reps: int) -> dict:
    """Where ``Miita.plan`` spends its time on the graph path (default preset): each step's median
    over ``reps`` plans, each right after its own prompt pass. The steps are wrapped for the
    measurement and restored after; ``graph search`` is usearch's own call, ``candidates`` includes
    it (and the exact re-score and the cut with duplicate groups; for the inverted file all of it
    is one native call), ``plan`` is the whole call."""
    import usearch.index as uindex

    from miita_edge.memory.bank import MemoryBank
    from miita_edge.method import ann_index, plan as plan_mod

    from miita_edge.method.ivf_index import IvfIndex

    spots = [(uindex.Index, "search", "graph search"), (ann_index.AnnIndex, "scored_top", "candidates (graph)"),
             (IvfIndex, "scored_top", "candidates (inverted file)"),
             (MemoryBank, "prepare_query", "prepare key"), (plan_mod, "knn_prototypes", "vote"),
             (plan_mod, "_relevance", "relevance gate")]
    times: dict[str, list] = {label: [] for *_, label in spots}
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in spots]

    def timed(fn, label):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                times[label].append(time.perf_counter() - t0)
        return wrapper

    try:
        for (obj, name, label), (_, _, fn) in zip(spots, saved):
            setattr(obj, name, timed(fn, label))
        total = []
        for i in range(reps):
            st = eng.query(prompts[i % len(prompts)], skip_bos_in_key=m.preset.skip_bos)
            t0 = time.perf_counter()
            m.plan(st)
            total.append(time.perf_counter() - t0)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    out = {label: statistics.median(v) * 1e3 for label, v in times.items() if v}
    out["plan"] = statistics.median(total) * 1e3
    return out


def _same(m, st) -> bool:
    """Whether the ANN path's selection (ids, scores, weights, gate decision) equals the exact one's."""
    a = m.plan(st)
    with Exact(m):
        b = m.plan(st)
    same = all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))
    if a.gate is not None or b.gate is not None:
        same = same and a.gate is not None and b.gate is not None and a.gate.reason == b.gate.reason \
            and np.array_equal(a.gate.keep, b.gate.keep)
    return same


def default_quality(m, Q_raw: np.ndarray) -> dict:
    """Recall of the exact top-k voter rows among the graph's candidates, and agreement of the
    selection with the relevance gate (as shipped) and without it (the vote alone). The model's reading
    of the vote's leading labels (``Preset.answer_reading``) is left out: it reweighs whatever both paths
    select, and needs a query's prompt, which these keys of test rows come without."""
    idx = m.retrieval_index()
    ann = idx.ann.ready()
    reading, m.preset.answer_reading = m.preset.answer_reading, 0.0
    try:
        return _quality(m, Q_raw, idx, ann, m.preset.k_anchors)
    finally:
        m.preset.answer_reading = reading


def _quality(m, Q_raw, idx, ann, k) -> dict:
    from miita_edge import _native

    hits, agree, agree_vote, kept = 0, 0, 0, 0
    for raw in Q_raw:
        q = m.bank.prepare_key(raw).astype(np.float32)
        top = ref_top(np.asarray(_native.bit_scores(idx.voters, q), np.float64), k)
        hits += np.isin(top, ann.propose(q, k)).sum()
        st = SimpleNamespace(key=raw)
        agree += _same(m, st)
        g = m.plan(st).gate
        kept += g is None or g.adapted
        m.preset.relevance_gate = False
        try:
            agree_vote += _same(m, st)
        finally:
            m.preset.relevance_gate = True
    return {"recall": hits / (k * len(Q_raw)), "agree": agree, "agree_vote": agree_vote, "steer": kept,
            "n": len(Q_raw)}


def paper_quality(m, eng, prompts: list) -> dict:
    """Recall of each channel's exact Top_R (numpy over the float32 unit rows) and agreement."""
    from miita_edge.method.vectors import normalize
    from miita_edge.method.uncertainty import direction_from_r

    m.keyed_engine()
    scan = m.retrieval_index().scan
    cfg = m.preset.retrieval
    hits = {"keys": 0, "dirs": 0}
    n_dir, agree = 0, 0
    for toks in prompts:
        st = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
        u = normalize(m.bank.prepare_key(st.key)).astype(np.float32)
        top = scan.row_owner[ref_top((scan.A_unit @ u).astype(np.float64), cfg.R_k)]  # one anchor per prototype
        hits["keys"] += np.isin(top, scan.row_owner[scan.ann[0].ready().propose(u, cfg.R_k)]).sum()
        r = eng.lm_head.restricted_uncertainty(st.logits, cfg.K_v)[4]
        d = direction_from_r(np.asarray(r, np.float64), cfg.eps_r)
        if d is not None:
            v = normalize(d).astype(np.float32)
            top = ref_top((scan.D_unit @ v).astype(np.float64), cfg.R_d)
            hits["dirs"] += np.isin(top, scan.ann[1].ready().propose(v, cfg.R_d)).sum()
            n_dir += 1
        a = m.plan(st)[:3]
        with Exact(m):
            b = m.plan(st)[:3]
        agree += np.array_equal(a[0], b[0]) and np.allclose(a[2], b[2], rtol=0, atol=1e-6)
    return {"recall": hits["keys"] / (cfg.R_k * len(prompts)),
            "recall_dirs": hits["dirs"] / (cfg.R_d * n_dir) if n_dir else float("nan"),
            "agree": agree, "n": len(prompts)}


def make_memory(tm, J, mode, centres, noise, radius, work: Path, name: str) -> tuple[Path, float]:
    rng = np.random.default_rng(J)
    t0 = time.perf_counter()
    arrays = synthetic_arrays(tm, J, mode, rng, centres, noise, radius)
    path = work / name
    commit(path, tm, arrays)
    return path, time.perf_counter() - t0


def run_case(eng, tm, J, mode, centres, noise, radius, prompts, Q_raw, args, work: Path) -> None:
    from miita_edge.method import ann_index

    preset = tm.m.preset.name
    path, made = make_memory(tm, J, mode, centres, noise, radius, work, f"{preset}-{mode}-{J}")
    shutil.rmtree(ann_index.cache_dir(), ignore_errors=True)
    m, cold = open_memory(eng, path, prompts[0])
    fr = fronts(m)
    if not fr:
        print(f"   {preset:7s} {mode:9s} {J:>9,}  no graph front (below ann_index.min_rows or usearch missing)")
        return
    t0 = time.perf_counter()
    for f in fr:
        f.wait()
    waited = time.perf_counter() - t0
    build = sum(f.build_s for f in fr)
    rows = [f.rows.shape[0] for f in fr]
    nodes = [indexed(f) for f in fr]
    del m, fr
    gc.collect()
    m, warm = open_memory(eng, path, prompts[0])
    states = ",".join(f.state for f in fronts(m))
    apply_overrides(m, args.ef, args.nprobe)
    if preset == "default":
        k = m.preset.k_anchors
        count = ann_index.search_params("bits", rows[0], k)[0]
        q = default_quality(m, Q_raw)
    else:
        count = ann_index.search_params("f16", J, m.preset.retrieval.R_k)[0]
        q = paper_quality(m, eng, prompts[: args.paper_queries])
    r = retrieval_share(m, eng, prompts, args.reps)
    steps = plan_steps(m, eng, prompts, args.steps) if args.steps and preset == "default" else None
    share, share_x = 100 * r["ann"] / r["prompt"], 100 * r["exact"] / r["prompt"]
    rec = f"recall@{count} {q['recall']:.4f}" + (f" (dirs {q['recall_dirs']:.4f})" if "recall_dirs" in q else "")
    ok = args.goals.check("share_100k" if J <= 100_000 else "share_1m", share)
    okr = args.goals.check("recall", min(q["recall"], q.get("recall_dirs", 1.0)))
    same = (f"same selection {q['agree']}/{q['n']} (vote alone {q['agree_vote']}/{q['n']}; gate let "
            f"{q['steer']}/{q['n']} steer)" if preset == "default" else f"same selection {q['agree']}/{q['n']}")
    print(f"   {preset:7s} {mode:9s} {J:>9,}  prompt {r['prompt']:6.1f} ms  ANN {r['ann']:6.2f} ms = {share:5.2f}% "
          f"({ok})  exact {r['exact']:6.2f} ms = {share_x:5.2f}%")
    print(f"   {'':7s} {'':9s} {'':>9s}  {rec} ({okr}), {same}")
    print(f"   {'':7s} {'':9s} {'':>9s}  rows {'+'.join(f'{x:,}' for x in rows)} (graph nodes "
          f"{'+'.join(f'{x:,}' for x in nodes)}); build {build:5.1f} s (ready {cold['total'] + waited:5.1f} s "
          f"after the open began); open cold {cold['total']:5.2f} s (Miita {cold['miita']:.2f}, index "
          f"{cold['index']:.2f}), warm {warm['total']:5.2f} s (Miita {warm['miita']:.2f}, index "
          f"{warm['index']:.2f}) [{states}]; memory made in {made:.1f} s", flush=True)
    if steps:
        print(f"   {'':7s} {'':9s} {'':>9s}  steps of Miita.plan (medians of {args.steps}, each after a prompt pass, "
              f"ms): " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()), flush=True)
    del m
    gc.collect()


_FIT_CHILD = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(float(sys.argv[2]) * 2**30), resource.RLIM_INFINITY))
from miita_edge.method import ann_index
ann_index.MIN_ROWS = ann_index.MIN_ROWS_FLOAT = 1 << 62  # the exact scan: whether the memory fits, not the graph
from miita_edge.miita import Miita
from miita_edge.runtime.engine import Engine, EngineConfig
eng = Engine(None, EngineConfig(n_threads=1))
toks = eng.tokenize("Classify the banking customer query into an intent.\\nQuery: where is my card?\\nIntent:")
try:
    t0 = time.perf_counter()
    m = Miita(engine=eng, memory=sys.argv[1])
    st = m.keyed_engine().query(toks, skip_bos_in_key=m.preset.skip_bos)
    m.plan(st)
    t1 = time.perf_counter()
    m.plan(eng.query(toks, skip_bos_in_key=m.preset.skip_bos))
    t2 = time.perf_counter()
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    print(f"ok {t1 - t0:.2f} {(t2 - t1) * 1e3:.1f} {int(hwm) / 2**20:.2f}")
except MemoryError:
    print("memoryerror")
"""


def paper_fit(tm, sizes, args, work: Path) -> None:
    """Whether a paper-preset memory of each size opens and answers within --max-gib (a child
    process per size, exact scan, no graph): open + first plan time, peak resident memory."""
    import subprocess

    for J in sizes:
        try:
            path, _ = make_memory(tm, J, "uniform", (None, None), (0.0, 0.0), 0, work, f"fit-{J}")
        except MemoryError:
            print(f"   paper {J:>9,}: the synthetic arrays alone do not fit in {args.max_gib:g} GiB", flush=True)
            continue
        gc.collect()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-c", _FIT_CHILD, str(path), str(args.max_gib)], capture_output=True,
                           text=True, env=env)
        out = (r.stdout.strip().splitlines() or ["?"])[-1]
        if out.startswith("ok"):
            _, t_open, t_plan, hwm = out.split()
            print(f"   paper {J:>9,}: opens and answers; open + first plan {float(t_open):.1f} s, next plan "
                  f"{float(t_plan):.0f} ms, peak resident {float(hwm):.1f} GiB", flush=True)
        else:
            why = "MemoryError" if out == "memoryerror" else f"exit {r.returncode}: {r.stderr.strip()[-200:]}"
            print(f"   paper {J:>9,}: does not fit in {args.max_gib:g} GiB ({why})", flush=True)
        shutil.rmtree(path, ignore_errors=True)


def real_memory(eng, args, k: dict, work: Path) -> None:
    """The inverted file on a real memory far below ``MIN_ROWS``: what a user's memory looks like,
    not synthetic clusters. Every training row ingested, then the front forced on."""
    from miita_edge.method import ann_index
    from miita_edge.miita import Miita
    from miita_edge.streams import read_examples

    path = work / "real"
    train = read_examples(args.data / "train.jsonl")
    t0 = time.perf_counter()
    Miita(engine=eng, memory=path, template="banking77").ingest(train, budget="none", progress=False)
    made = time.perf_counter() - t0
    saved = ann_index.MIN_ROWS
    ann_index.MIN_ROWS = 0
    try:
        m = Miita(engine=eng, memory=path, template="banking77")
        fr = fronts(m)
        for f in fr:
            f.wait()
        q = default_quality(m, k["test_raw"][: args.queries])
    finally:
        ann_index.MIN_ROWS = saved
    print(f"\nreal memory: {len(train):,} Banking77 training rows (ingested in {made:.0f} s) = {fr[0].rows.shape[0]:,} "
          f"voter rows, front {type(fr[0].ready()).__name__} forced on\n   recall@{ann_index.search_params('bits', fr[0].rows.shape[0], m.preset.k_anchors)[0]} "
          f"{q['recall']:.5f}, same selection {q['agree']}/{q['n']} (vote alone {q['agree_vote']}/{q['n']}; gate let "
          f"{q['steer']}/{q['n']} steer)", flush=True)


def crossover(eng, tm, sizes, centres, noise, radius, prompts, args, work: Path) -> None:
    """Exact scan vs the graph (clustered keys) by size, to set MIN_ROWS (MIN_ROWS_FLOAT), which
    counts the rows a graph indexes: voter rows (default preset), rows per channel (paper preset)."""
    from miita_edge.method import ann_index

    saved = ann_index.MIN_ROWS, ann_index.MIN_ROWS_FLOAT
    ann_index.MIN_ROWS = ann_index.MIN_ROWS_FLOAT = 0
    try:
        for J in sizes:
            path, _ = make_memory(tm, J, "clustered", centres, noise, radius, work, f"cross-{J}")
            m, _ = open_memory(eng, path, prompts[0])
            fr = fronts(m)
            for f in fr:
                f.wait()
            r = retrieval_share(m, eng, prompts, args.reps)
            what = "voter rows" if m.preset.aggregation != "paper" else "rows per channel"
            print(f"   {J:>8,} prototypes = {fr[0].rows.shape[0]:>8,} {what} "
                  f"({'+'.join(f'{indexed(f):,}' for f in fr)} nodes)  exact {r['exact']:6.3f} ms  "
                  f"ANN {r['ann']:6.3f} ms  ratio {r['ann'] / r['exact']:.2f}  (prompt {r['prompt']:.1f} ms; "
                  f"graph built in {sum(f.build_s for f in fr):.1f} s)", flush=True)
            del m, f, fr
            gc.collect()
            shutil.rmtree(path, ignore_errors=True)
    finally:
        ann_index.MIN_ROWS, ann_index.MIN_ROWS_FLOAT = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/banking77"))
    ap.add_argument("--sizes", default="100000,1000000", help="default-preset memory sizes (prototypes)")
    ap.add_argument("--paper-sizes", default="100000", help="paper-preset sizes; 0: none")
    ap.add_argument("--modes", default="clustered,uniform")
    ap.add_argument("--paper-modes", default="clustered", help="key distributions for the paper preset (a "
                    "uniform 100k paper memory takes ~20 min to graph on one thread)")
    ap.add_argument("--queries", type=int, default=200, help="real test keys for recall (default preset)")
    ap.add_argument("--paper-queries", type=int, default=40, help="prompt passes for recall (paper preset)")
    ap.add_argument("--reps", type=int, default=9, help="prompt passes per path for the retrieval share")
    ap.add_argument("--steps", type=int, default=0, help="also time the steps of Miita.plan over this many "
                    "plans, each after a prompt pass (default preset, graph path)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nprobe", type=int, default=None, help="override the inverted file's probed lists (default: "
                    "as many as hold ivf_index.SCAN_ROWS rows; all lists make a run that misses its time target)")
    ap.add_argument("--ef", type=int, default=None, help="override the graph's search breadth (default: the "
                    "candidate count)")
    ap.add_argument("--candidates", type=int, default=None, help="override the candidate count (ann_index.SEARCH)")
    ap.add_argument("--bits-front", choices=("ivf", "graph"), default=None, help="the front of the default preset's "
                    "1-bit rows (ann_index.BITS_FRONT; default: as shipped)")
    ap.add_argument("--spread", choices=("nn", "pairs"), default="nn", help="the same-label spread the clustered keys "
                    "copy: to the nearest same-label key (default) or between all same-label pairs (wider)")
    ap.add_argument("--min-rows", type=int, default=None, help="override ann_index.MIN_ROWS (voter rows from which "
                    "the front is used), to measure the front's recall below the shipped threshold")
    ap.add_argument("--real-memory", action="store_true", help="only the front against the exact scan on a real "
                    "memory: every Banking77 training row ingested (default preset), the front used whatever the "
                    "size (--min-rows 0), recall and same selections over the real test keys (--queries)")
    ap.add_argument("--crossover", default=None, help="only the crossover: comma list of sizes (prototypes)")
    ap.add_argument("--crossover-preset", choices=("default", "paper"), default="default")
    ap.add_argument("--paper-fit", default=None, help="only whether paper-preset memories of these sizes open "
                    "within --max-gib: comma list")
    ap.add_argument("--max-gib", type=float, default=16.0, help="address-space limit of this process (an OOM "
                    "becomes a MemoryError here instead of a kill on a shared machine)")
    add_target_argument(ap, targets())
    args = ap.parse_args(argv)
    args.goals = Targets.from_args(targets(), args.target, ap)
    print_header(argv)
    resource.setrlimit(resource.RLIMIT_AS, (int(args.max_gib * 2**30), resource.RLIM_INFINITY))

    from miita_edge.method import ann_index
    from miita_edge.runtime.engine import Engine, EngineConfig

    if args.bits_front:
        ann_index.BITS_FRONT = args.bits_front
    if args.min_rows is not None:
        ann_index.MIN_ROWS = args.min_rows
    if args.candidates:
        ann_index.SEARCH = {kind: ((0, args.candidates, args.candidates),) for kind in ann_index.SEARCH}
    work = Path(tempfile.mkdtemp(prefix="miita-ann-bench-"))
    os.environ["MIITA_EDGE_ANN_CACHE"] = str(work / "ann-cache")
    import usearch

    eng = Engine(None, EngineConfig(n_threads=args.threads))
    try:
        want_paper = bool(args.paper_fit) or (args.crossover_preset == "paper" if args.crossover else
                                               any(int(x) > 0 for x in args.paper_sizes.split(",")))
        tm = {"default": template_memory(eng, "default", args.data, work)}
        if want_paper:
            tm["paper"] = template_memory(eng, "paper", args.data, work)
        print(f"# threads={args.threads}  usearch {usearch.__version__}  "
              f"graph: connectivity {ann_index.CONNECTIVITY}, expansion_add {ann_index.EXPANSION_ADD}, "
              f"(from rows, candidates, expansion_search) {ann_index.SEARCH}{f', ef override {args.ef}' if args.ef else ''}, "
              f"build threads {ann_index.BUILD_THREADS}, MIN_ROWS {ann_index.MIN_ROWS} (float rows "
              f"{ann_index.min_rows('f16')}); 1-bit rows fronted by: {ann_index.BITS_FRONT}")
        for t in tm.values():
            pr, b = t.m.preset, t.m.bank
            print(f"# {pr.name}/{pr.version} preset: key layers {t.m.key_layers}, {b.key_dim} key coordinates "
                  f"({b.config.key_precision}, centred {pr.center_keys}, order {pr.key_order}), centroid vote "
                  f"{pr.centroid_vote}, relevance gate {pr.relevance_gate}; arrays "
                  + ", ".join(f"{n} {np.dtype(d).name}{list(sh) if sh else ''}" for n, (d, sh) in t.spec.items()))
        if args.paper_fit:
            print(f"\npaper preset: does a memory open and answer within {args.max_gib:g} GiB?")
            paper_fit(tm["paper"], [int(x) for x in args.paper_fit.split(",")], args, work)
            return 0

        # real keys: the spread of same-label keys sets the synthetic clusters
        k, test_texts = real_keys(eng, tm["default"].m, args.data, max(500, args.queries))
        bank = tm["default"].m.bank
        B = np.packbits(np.stack([bank.prepare_key(x) for x in k["train_raw"]]) >= 0, axis=1)
        bits = bank.key_dim
        Bu = np.unpackbits(B, axis=1, count=bits).astype(np.int16)
        lab = k["train_label"]
        ham = same_label_pairs(Bu, lab, lambda Y: (Y[:, None, :] != Y[None, :, :]).sum(-1) / bits)
        ham_nn = nearest_same_label(Bu, lab, lambda Y: -(Y[:, None, :] != Y[None, :, :]).sum(-1) / bits)
        nn = args.spread == "nn"
        d = float(np.median(-ham_nn if nn else ham))
        f = (1 - np.sqrt(1 - 2 * d)) / 2  # two keys of one centre then differ in 2f(1-f) of their bits
        radius = int(np.floor((1 - 2 * d) * 127))  # as stored: the cosine of two sign vectors d apart
        print(f"# real keys ({len(B)} Banking77 training prompts), normalised Hamming distance of their {bits}-bit "
              f"prepared keys: nearest same-label key median {np.median(-ham_nn):.3f}, same-label pairs ({len(ham)}) "
              f"median {np.median(ham):.3f} (p10 {np.percentile(ham, 10):.3f}, p90 {np.percentile(ham, 90):.3f}) -> "
              f"flip rate {f:.3f} ({'nearest same-label' if nn else 'same-label pair'} spread), stored radius "
              f"{radius}/127")
        centres, noise = {"default": B}, {"default": f}
        if "paper" in tm:
            pe = paper_examples(eng, tm["paper"].m, args.data)
            H = pe["key"].shape[1]
            sig = {}
            for name in ("key", "dir"):  # noise whose two draws around one centre have the real cosine
                cs = (nearest_same_label if nn else same_label_pairs)(pe[name], pe["label"], lambda Y: Y @ Y.T)
                sig[name] = (float(np.median(cs)), float(np.sqrt((1 / np.median(cs) - 1) / H)))
            print(f"# paper preset ({len(pe['key'])} training examples): median cosine to the "
                  f"{'nearest same-label' if nn else 'same-label'} key {sig['key'][0]:.5f} -> noise sigma "
                  f"{sig['key'][1]:.2e}; direction {sig['dir'][0]:.4f} -> sigma {sig['dir'][1]:.2e} per component")
            centres["paper"], noise["paper"] = (pe["key"], pe["dir"]), (sig["key"][1], sig["dir"][1])

        tpl = tm["default"].m.template
        prompts = [eng.tokenize(tpl.render_prompt(t)) for t in test_texts[:max(args.reps, args.paper_queries)]]
        if args.real_memory:
            real_memory(eng, args, k, work)
            return 0
        if args.crossover:
            cp = args.crossover_preset
            print(f"\ncrossover: retrieval after a prompt pass, {cp} preset, clustered keys (medians of {args.reps})")
            crossover(eng, tm[cp], [int(x) for x in args.crossover.split(",")], centres[cp], noise[cp], radius,
                      prompts, args, work)
            return 0
        Q_raw = k["test_raw"][: args.queries]
        print(f"\nretrieval share of the prompt pass (medians of {args.reps} per path), recall over "
              f"{args.queries} real test keys (default) / {args.paper_queries} prompts (paper)")
        for preset, sizes, modes in (("default", args.sizes, args.modes), ("paper", args.paper_sizes, args.paper_modes)):
            for J in [int(x) for x in sizes.split(",") if int(x) > 0]:
                for mode in modes.split(","):
                    try:
                        run_case(eng, tm[preset], J, mode, centres[preset], noise[preset], radius, prompts, Q_raw,
                                 args, work)
                    except MemoryError:
                        print(f"   {preset:7s} {mode:9s} {J:>9,}  does not fit in {args.max_gib:g} GiB "
                              f"(MemoryError)", flush=True)
                    finally:
                        shutil.rmtree(work / f"{preset}-{mode}-{J}", ignore_errors=True)
                        gc.collect()
        print(args.goals.summary())
    finally:
        eng.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
