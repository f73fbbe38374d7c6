"""Retrieval at 100k-1M prototypes (issue 15): the usearch front (method/ann_index.py) against the
exact scan, in one run.

For each preset, size and key distribution, a synthetic memory is committed to a temporary store
and opened as a user's memory would be (graphs cached in a temporary folder, not the user's):

  open       Miita(memory=...) and its first retrieval index (for the paper preset: the first plan,
             which builds its scan index): cold (no cached graph: it is built on a background
             thread while the exact scan answers) and warm (the graph mapped from the cache)
  build      the graph's build time on its background thread (ann_index.BUILD_THREADS threads)
  retrieval  Miita.plan right after a real prompt pass (a Banking77 test prompt), ANN and exact
             alternated, medians of --reps, as a share of the same run's prompt pass
             (targets: <= 1% at 100k, <= 3% at 1M)
  recall     recall@R: the share of the exact top-k (numpy over the exact scores) among the R
             candidates the graph proposes, over --queries real Banking77 test keys (target >= 0.99)
  agreement  queries whose selected prototypes (ids, weights, scores) equal the exact path's

Key distributions:
  clustered  the real keys of the 3,075 Banking77 training prompts as centres (default preset:
             1-bit centred keys; paper preset: unit keys and directions d = Norm(R_m), extracted
             once with the model and cached); a synthetic key is a centre with a share f of its
             bits flipped, f chosen so that two keys of one centre differ as much as a real key and
             its nearest same-label key (median Hamming distance; --spread pairs: as two real keys
             of one label); paper keys and directions get Gaussian noise matching the median
             cosine the same way
  uniform    random keys and directions (bench/memory.py's synthetic_bank): a graph's worst case

    python bench/ann.py                                  # 100k and 1M (default), 100k (paper)
    python bench/ann.py --crossover 5000,10000,20000,50000
    python bench/ann.py --paper-fit 300000,500000,1000000
    python bench/ann.py --sizes 100000 --paper-sizes 0 --ef 16 --candidates 8   # a run that misses
"""
from __future__ import annotations

import argparse
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

H = 640


# ----------------------------------------------------------------------------- real keys
def real_keys(data: Path, n_train: int | None, n_test: int, threads: int = 1):
    """Keys of Banking77 prompts through the banking77 template, extracted once and cached.

    Returns a dict: ``train_raw`` / ``test_raw`` (n, H) float32 mean-pooled keys without the BOS
    row (the default preset's key), ``bos_row`` (H,) the key-layer row of BOS alone,
    ``train_rows`` / ``test_rows`` the pooled row counts, ``train_label`` / ``test_label`` label
    ids, and ``key_mean`` the default preset's centring vector for this template.
    """
    from miita_edge.method.calibration import _cache_dir, calibration_mean
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.fingerprint import model_sha256
    from miita_edge.streams import read_examples

    train = list(read_examples(data / "train.jsonl"))[:n_train]
    test = list(read_examples(data / "test.jsonl"))[:n_test]
    eng = Engine(None, EngineConfig(n_threads=threads))
    sha = model_sha256(eng.info.path)
    tag = hashlib.sha256(f"{sha}|{data.resolve()}|{len(train)}|{len(test)}".encode()).hexdigest()[:16]
    path = _cache_dir() / "bench" / f"banking77-keys-{tag}.npz"
    if path.exists():
        eng.close()
        return dict(np.load(path)), [e.input for e in test]
    tpl = get_template("banking77")
    fp = {"sha256": sha, "key_layer": eng.key_layer}
    out = {"key_mean": calibration_mean(eng, tpl, True, fp)}
    out["bos_row"] = eng.query([eng.bos], skip_bos_in_key=False).key.astype(np.float32)
    labels = sorted({e.output for e in train} | {e.output for e in test})
    t0 = time.perf_counter()
    for name, rows in (("train", train), ("test", test)):
        K, n = [], []
        for i, e in enumerate(rows):
            st = eng.query(eng.tokenize(tpl.render_prompt(e.input)), skip_bos_in_key=True)
            K.append(st.key.astype(np.float32))
            n.append(st.key_rows)
            if i % 500 == 0:
                print(f"#   keys: {name} {i}/{len(rows)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        out[f"{name}_raw"] = np.stack(K)
        out[f"{name}_rows"] = np.array(n, np.int32)
        out[f"{name}_label"] = np.array([labels.index(e.output) for e in rows], np.int32)
    eng.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)
    return out, [e.input for e in test]


def paper_examples(data: Path, threads: int = 1) -> dict:
    """Real paper-preset keys and directions of the Banking77 training prompts (eqs. 1-2: the key
    with BOS, d = Norm(R_m)), extracted once and cached like ``real_keys``: ``key`` (n, H) unit,
    ``dir`` (n, H) unit, ``label`` (n,)."""
    from miita_edge.method.calibration import _cache_dir
    from miita_edge.method.ingest import extract_examples
    from miita_edge.method.presets import paper_preset
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.fingerprint import model_sha256
    from miita_edge.streams import read_examples

    train = list(read_examples(data / "train.jsonl"))
    eng = Engine(None, EngineConfig(n_threads=threads))
    tag = hashlib.sha256(f"{model_sha256(eng.info.path)}|{data.resolve()}|{len(train)}".encode()).hexdigest()[:16]
    path = _cache_dir() / "bench" / f"banking77-paper-{tag}.npz"
    if path.exists():
        eng.close()
        return dict(np.load(path))
    labels = sorted({e.output for e in train})
    keys, dirs, labs = [], [], []
    t0 = time.perf_counter()
    for i in range(0, len(train), 64):
        part = train[i:i + 64]
        for e, x in zip(part, extract_examples(eng, get_template("banking77"), paper_preset(), part)):
            if x is not None:
                keys.append(x.key / np.linalg.norm(x.key))
                dirs.append(x.R_mean / np.linalg.norm(x.R_mean))
                labs.append(labels.index(e.output))
        print(f"#   paper directions: {i + len(part)}/{len(train)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    eng.close()
    out = {"key": np.array(keys, np.float32), "dir": np.array(dirs, np.float32), "label": np.array(labs, np.int32)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)
    return out


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
def synthetic_arrays(preset: str, J: int, mode: str, rng, centres: np.ndarray, noise: float) -> dict:
    """A memory's stored arrays: J prototypes with one anchor each, in the preset's form."""
    owner_dt = np.uint16 if J < 65536 else np.uint32
    out = {"anchor_owner": np.arange(J).astype(owner_dt), "anchor_count": np.ones(J, np.uint16),
           "counts": np.ones(J, np.uint32)}
    if preset == "default":
        keys = np.empty((J, H // 8), np.uint8)
        for s in range(0, J, 50_000):
            n = min(50_000, J - s)
            if mode == "uniform":
                keys[s:s + n] = rng.integers(0, 256, (n, H // 8), dtype=np.uint8)
            else:  # a centre's bits, each flipped with probability `noise`
                c = np.unpackbits(centres[rng.integers(0, len(centres), n)], axis=1).astype(bool)
                keys[s:s + n] = np.packbits(c ^ (rng.random((n, H), np.float32) < noise), axis=1)
        toks = np.full((J, 4), -1, np.int32)
        toks[:, :3] = rng.integers(1000, 200_000, (J, 3))
        out.update(anchors=keys, tokens=toks.reshape(-1))
    else:
        A = np.empty((J, H), np.float32)
        D = np.empty((J, H), np.float32)
        (K, Dc), (sk, sd) = centres, noise  # real keys and directions of one example each, and their noise
        for s in range(0, J, 50_000):
            n = min(50_000, J - s)
            if mode == "uniform":
                a, d = rng.standard_normal((n, H), np.float32), rng.standard_normal((n, H), np.float32)
            else:  # one real example's key and direction, each with its own noise
                c = rng.integers(0, len(K), n)
                a = K[c] + sk * rng.standard_normal((n, H), np.float32)
                d = Dc[c] + sd * rng.standard_normal((n, H), np.float32)
            A[s:s + n] = a / np.linalg.norm(a, axis=1, keepdims=True)
            D[s:s + n] = d / np.linalg.norm(d, axis=1, keepdims=True)
        out.update(anchors=A, dirs=D)
    return out


def commit(path: Path, manifest: dict, arrays: dict) -> None:
    from miita_edge.memory.store import Store

    J = len(arrays["counts"])
    meta = dict(manifest, prototypes=J, anchors=J, examples=J, budget="none")
    with Store(path).writer() as w:
        w.commit(arrays, meta)


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


def apply_overrides(m, ef: int | None) -> None:
    for f in fronts(m):
        if f.ready() is not None and ef:
            f.ready().ef = ef  # the graph's search breadth, instead of the candidate count


# ----------------------------------------------------------------------------- measurements
def ref_top(s: np.ndarray, k: int) -> np.ndarray:
    """Top-k, ties to the lower index (the exact path's rule), by one partition and a sort."""
    if len(s) > 4 * k:
        kth = np.partition(s, len(s) - k)[len(s) - k]
        cand = np.flatnonzero(s >= kth)
        return cand[np.lexsort((cand, -s[cand]))][:k]
    return np.lexsort((np.arange(len(s)), -s))[:k]


def open_memory(eng, path: Path, st0) -> tuple:
    """Open a memory and make its first plan ready; returns (Miita, seconds by step)."""
    from miita_edge.miita import Miita

    t0 = time.perf_counter()
    m = Miita(engine=eng, memory=path)
    t1 = time.perf_counter()
    m.retrieval_index()
    t2 = time.perf_counter()
    if m.preset.aggregation == "paper":
        m.plan(st0)  # builds the scan index and its graph fronts
    t3 = time.perf_counter()
    return m, {"miita": t1 - t0, "index": t2 - t1, "scan": t3 - t2, "total": t3 - t0}


def retrieval_share(m, eng, prompts: list, reps: int) -> dict:
    """Medians of prompt pass and Miita.plan (ANN and exact alternated, each after its own pass)."""
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


def default_quality(m, Q_raw: np.ndarray, count: int) -> dict:
    """Recall@count of the exact top-k anchors, and agreement of the selected prototypes."""
    from miita_edge import _native

    idx = m.retrieval_index()
    ann = idx.ann.ready()
    k = m.preset.k_anchors
    hits, agree = 0, 0
    for raw in Q_raw:
        q = m.bank.prepare_key(raw).astype(np.float32)
        top = ref_top(np.asarray(_native.bit_scores(idx.packed, q), np.float64), k)
        hits += np.isin(top, ann.propose(q, k)).sum()
        st = SimpleNamespace(key=raw)
        a = m.plan(st)[:3]
        with Exact(m):
            b = m.plan(st)[:3]
        agree += all(np.array_equal(x, y) for x, y in zip(a, b))
    return {"recall": hits / (k * len(Q_raw)), "agree": agree, "n": len(Q_raw)}


def paper_quality(m, eng, prompts: list, count: int) -> dict:
    """Recall@count of each channel's exact Top_R (numpy over the float32 unit rows) and agreement."""
    from miita_edge.method.vectors import normalize
    from miita_edge.method.uncertainty import direction_from_r

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


def run_case(eng, manifests, preset, J, mode, centres, noise, prompts, Q_raw, args, work: Path) -> None:
    from miita_edge.method import ann_index

    rng = np.random.default_rng(J)
    t0 = time.perf_counter()
    arrays = synthetic_arrays(preset, J, mode, rng, centres[preset], noise[preset])
    path = work / f"{preset}-{mode}-{J}"
    commit(path, manifests[preset], arrays)
    del arrays
    made = time.perf_counter() - t0
    shutil.rmtree(ann_index.cache_dir(), ignore_errors=True)
    st0 = eng.query(prompts[0], skip_bos_in_key=True)
    m, cold = open_memory(eng, path, st0)
    fr = fronts(m)
    if not fr:
        print(f"   {preset:7s} {mode:9s} {J:>8,}  no graph front (below MIN_ROWS or usearch missing)")
        return
    for f in fr:
        f.wait()
    build = sum(f.build_s for f in fr)
    m, warm = open_memory(eng, path, st0)
    states = ",".join(f.state for f in fronts(m))
    apply_overrides(m, args.ef)
    kind = "bits" if preset == "default" else "f16"
    count = ann_index.search_params(kind, J, m.preset.k_anchors if preset == "default" else m.preset.retrieval.R_k)[0]
    if preset == "default":
        q = default_quality(m, Q_raw, count)
    else:
        q = paper_quality(m, eng, prompts[: args.paper_queries], count)
    r = retrieval_share(m, eng, prompts, args.reps)
    target = 1.0 if J <= 100_000 else 3.0
    share, share_x = 100 * r["ann"] / r["prompt"], 100 * r["exact"] / r["prompt"]
    rec = f"recall@{count} {q['recall']:.3f}" + (f" (dirs {q['recall_dirs']:.3f})" if "recall_dirs" in q else "")
    ok = "met" if share <= target else "MISSED"
    okr = "met" if min(q["recall"], q.get("recall_dirs", 1.0)) >= 0.99 else "MISSED"
    print(f"   {preset:7s} {mode:9s} {J:>9,}  prompt {r['prompt']:6.1f} ms  ANN {r['ann']:6.2f} ms = {share:5.2f}% "
          f"(target <= {target:.0f}%: {ok})  exact {r['exact']:6.2f} ms = {share_x:5.2f}%")
    print(f"   {'':7s} {'':9s} {'':>9s}  {rec} (target >= 0.99: {okr}), same selection {q['agree']}/{q['n']}; "
          f"build {build:5.1f} s; open cold {cold['total']:5.2f} s (Miita {cold['miita']:.2f}, index "
          f"{cold['index']:.2f}, scan {cold['scan']:.2f}), warm {warm['total']:5.2f} s [{states}]; memory made in "
          f"{made:.1f} s", flush=True)
    del m


_FIT_CHILD = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(float(sys.argv[2]) * 2**30), resource.RLIM_INFINITY))
from miita_edge.method import ann_index
ann_index.MIN_ROWS = 1 << 62  # the exact scan: this measures whether the memory fits, not the graph
from miita_edge.miita import Miita
from miita_edge.runtime.engine import Engine, EngineConfig
eng = Engine(None, EngineConfig(n_threads=1))
toks = eng.tokenize("Classify the banking customer query into an intent.\\nQuery: where is my card?\\nIntent:")
try:
    t0 = time.perf_counter()
    m = Miita(engine=eng, memory=sys.argv[1])
    st = eng.query(toks, skip_bos_in_key=False)
    m.plan(st)
    t1 = time.perf_counter()
    m.plan(eng.query(toks, skip_bos_in_key=False))
    t2 = time.perf_counter()
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    print(f"ok {t1 - t0:.2f} {(t2 - t1) * 1e3:.1f} {int(hwm) / 2**20:.2f}")
except MemoryError:
    print("memoryerror")
"""


def paper_fit(manifests, sizes, args, work: Path) -> None:
    """Whether a paper-preset memory of each size opens and answers within --max-gib (a child
    process per size, exact scan, no graph): open + first plan time, peak resident memory."""
    import subprocess

    for J in sizes:
        path = work / f"fit-{J}"
        try:
            commit(path, manifests["paper"], synthetic_arrays("paper", J, "uniform", np.random.default_rng(J),
                                                              (None, None), (0.0, 0.0)))
        except MemoryError:
            print(f"   paper {J:>9,}: the synthetic arrays alone do not fit in {args.max_gib:g} GiB", flush=True)
            continue
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


def crossover(eng, manifests, sizes, centres, noise, prompts, args, work: Path) -> None:
    """Exact scan vs the graph (default preset, clustered keys) by size, to set MIN_ROWS."""
    from miita_edge.method import ann_index

    min_rows, ann_index.MIN_ROWS = ann_index.MIN_ROWS, 0
    try:
        for J in sizes:
            path = work / f"cross-{J}"
            commit(path, manifests["default"], synthetic_arrays("default", J, "clustered",
                                                                np.random.default_rng(J), centres["default"],
                                                                noise["default"]))
            st0 = eng.query(prompts[0], skip_bos_in_key=True)
            m, _ = open_memory(eng, path, st0)
            f = fronts(m)[0]
            f.wait()
            r = retrieval_share(m, eng, prompts, args.reps)
            print(f"   {J:>8,} anchors  exact {r['exact']:6.3f} ms  ANN {r['ann']:6.3f} ms  ratio {r['ann'] / r['exact']:.2f}"
                  f"  (prompt {r['prompt']:.1f} ms; graph built in {f.build_s:.1f} s)", flush=True)
    finally:
        ann_index.MIN_ROWS = min_rows


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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ef", type=int, default=None, help="override the graph's search breadth (default: the "
                    "candidate count)")
    ap.add_argument("--candidates", type=int, default=None, help="override the candidate count (ann_index.SEARCH)")
    ap.add_argument("--spread", choices=("nn", "pairs"), default="nn", help="the same-label spread the clustered keys "
                    "copy: to the nearest same-label key (default) or between all same-label pairs (wider)")
    ap.add_argument("--crossover", default=None, help="only the crossover: comma list of sizes")
    ap.add_argument("--paper-fit", default=None, help="only whether paper-preset memories of these sizes open "
                    "within --max-gib: comma list")
    ap.add_argument("--max-gib", type=float, default=16.0, help="address-space limit of this process (an OOM "
                    "becomes a MemoryError here instead of a kill on a shared machine)")
    args = ap.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (int(args.max_gib * 2**30), resource.RLIM_INFINITY))

    from miita_edge.method import ann_index
    from miita_edge.method.templates import get_template
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig

    k, test_texts = real_keys(args.data, None, 500)
    if args.candidates:
        ann_index.SEARCH = {kind: ((0, args.candidates, args.candidates),) for kind in ann_index.SEARCH}
    work = Path(tempfile.mkdtemp(prefix="miita-ann-bench-"))
    os.environ["MIITA_EDGE_ANN_CACHE"] = str(work / "ann-cache")
    import usearch

    print(f"# bench/ann.py  cpu={os.cpu_count()} ({_cpu()})  threads={args.threads}  usearch {usearch.__version__}  "
          f"graph: connectivity {ann_index.CONNECTIVITY}, expansion_add {ann_index.EXPANSION_ADD}, "
          f"(from rows, candidates, expansion_search) {ann_index.SEARCH}{f', ef override {args.ef}' if args.ef else ''}, build threads "
          f"{ann_index.BUILD_THREADS}, MIN_ROWS {ann_index.MIN_ROWS}")

    # real keys: the spread of same-label keys sets the synthetic clusters
    B = np.packbits((k["train_raw"] - k["key_mean"][None]) >= 0, axis=1)
    Bu = np.unpackbits(B, axis=1).astype(np.int16)
    lab = k["train_label"]
    ham = same_label_pairs(Bu, lab, lambda Y: (Y[:, None, :] != Y[None, :, :]).sum(-1) / H)
    ham_nn = nearest_same_label(Bu, lab, lambda Y: -(Y[:, None, :] != Y[None, :, :]).sum(-1) / H)
    nn = args.spread == "nn"
    d = float(np.median(-ham_nn if nn else ham))
    f = (1 - np.sqrt(1 - 2 * d)) / 2  # two keys of one centre then differ in 2f(1-f) of their bits
    print(f"# real keys ({len(B)} Banking77 training prompts), normalised Hamming distance of their 1-bit centred "
          f"keys: nearest same-label key median {np.median(-ham_nn):.3f}, same-label pairs ({len(ham)}) median "
          f"{np.median(ham):.3f} (p10 {np.percentile(ham, 10):.3f}, p90 {np.percentile(ham, 90):.3f}) -> flip rate "
          f"{f:.3f} ({'nearest same-label' if nn else 'same-label pair'} spread)")
    centres, noise = {"default": B}, {"default": f}
    if any(int(x) > 0 for x in args.paper_sizes.split(",")):
        pe = paper_examples(args.data)
        sig = {}
        for name in ("key", "dir"):  # noise whose two draws around one centre have the real cosine
            cs = (nearest_same_label if nn else same_label_pairs)(pe[name], pe["label"], lambda Y: Y @ Y.T)
            sig[name] = (float(np.median(cs)), float(np.sqrt((1 / np.median(cs) - 1) / H)))
        print(f"# paper preset ({len(pe['key'])} training examples): median cosine to the "
              f"{'nearest same-label' if nn else 'same-label'} key {sig['key'][0]:.5f} -> noise sigma "
              f"{sig['key'][1]:.2e}; direction {sig['dir'][0]:.4f} -> sigma {sig['dir'][1]:.2e} per component")
        centres["paper"], noise["paper"] = (pe["key"], pe["dir"]), (sig["key"][1], sig["dir"][1])

    eng = Engine(None, EngineConfig(n_threads=args.threads))
    tpl = get_template("banking77")
    prompts = [eng.tokenize(tpl.render_prompt(t)) for t in test_texts[:max(args.reps, args.paper_queries)]]
    manifests = {}
    for preset in ("default", "paper"):
        m0 = Miita(engine=eng, memory=work / f"empty-{preset}", preset=preset, template="banking77")
        manifests[preset] = m0.manifest()
    try:
        if args.paper_fit:
            print(f"\npaper preset: does a memory open and answer within {args.max_gib:g} GiB?")
            paper_fit(manifests, [int(x) for x in args.paper_fit.split(",")], args, work)
            return 0
        if args.crossover:
            print("\ncrossover: retrieval after a prompt pass, default preset, clustered keys "
                  f"(medians of {args.reps})")
            crossover(eng, manifests, [int(x) for x in args.crossover.split(",")], centres, noise, prompts, args, work)
            return 0
        Q_raw = k["test_raw"][: args.queries]
        print(f"\nretrieval share of the prompt pass (medians of {args.reps} per path), recall over "
              f"{args.queries} real test keys (default) / {args.paper_queries} prompts (paper)")
        for preset, sizes, modes in (("default", args.sizes, args.modes), ("paper", args.paper_sizes, args.paper_modes)):
            for J in [int(x) for x in sizes.split(",") if int(x) > 0]:
                for mode in modes.split(","):
                    try:
                        run_case(eng, manifests, preset, J, mode, centres, noise, prompts, Q_raw, args, work)
                    except MemoryError:
                        print(f"   {preset:7s} {mode:9s} {J:>9,}  does not fit in {args.max_gib:g} GiB "
                              f"(MemoryError)", flush=True)
                    finally:
                        shutil.rmtree(work / f"{preset}-{mode}-{J}", ignore_errors=True)
    finally:
        eng.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    sys.exit(main())
