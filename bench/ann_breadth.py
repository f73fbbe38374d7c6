"""The floor under retrieval at 100k prototypes (issue 15): how long the usearch graph's own search
takes right after a prompt pass, at each search breadth, and what recall that breadth keeps.

Why: ``bench/ann.py`` times all of ``Miita.plan`` (graph search, exact re-score, vote, relevance
gate). When that misses the issue's 1% of the prompt pass, the question is whether anything around
the search could close the gap, or whether the search alone is already over it. This times the
search alone, each time after a real prompt pass has evicted the caches (as in an ask), on graphs
over the same clustered keys as ``bench/ann.py`` (real Banking77 keys as centres, bits flipped at
the real nearest-same-label spread), and measures recall of the exact top-8 (the native 1-bit
scores of every row against a real test key) among the proposed candidates.

It also tries graphs over a *prefix* of each key (the first coordinates in the calibration order,
those that vary most): fewer bytes per distance, so possibly a cheaper walk; the candidates are
still re-scored with the whole key.

    python bench/ann_breadth.py                       # 100,000 rows, whole keys and 512/256-bit prefixes
    python bench/ann_breadth.py --rows 20000 --prefixes 0
    python bench/ann_breadth.py --prefixes 0 --settings 256:256 --ivf 256,1024    # and inverted files
    python bench/ann_breadth.py --rows 1000000 --no-graph --ivf-native 4096 --nprobe 32,64 --ivf-candidates 512

``--ivf NLISTS``: the alternative a graph is usually compared with, an inverted file over binary
centroids (``nlist`` rows drawn from the memory, two rounds of bitwise-majority k-means by Hamming
distance, every row in the list of its nearest centroid, lists stored contiguously). A query scores
the centroids with the native kernel, gathers the ``nprobe`` best lists' rows and scores them in one
call; timed like the graph (right after a prompt pass), recall of the exact top-8 among the rows
it scanned.

``--ivf-native NLISTS``: the product's inverted file (method/ivf_index.py, the default preset's front
since issue 15's fifth pass) with that many lists, probed through its native kernel (masked Hamming
distance, top candidates in one call); recall of the exact top-8 among its ``--ivf-candidates``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ann  # noqa: E402  (bench/ann.py: template memory, real keys, the clustered-key spread)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    ap.add_argument("--rows", type=int, default=100_000, help="graph rows (distinct keys)")
    ap.add_argument("--settings", default="256:256,128:128,96:96,64:64",
                    help="candidates:breadth pairs (ann_index.SEARCH uses 256:256 below 500,000 rows)")
    ap.add_argument("--prefixes", default="512,256", help="key prefixes (bits) to index instead; 0: none")
    ap.add_argument("--queries", type=int, default=200, help="real test keys for recall")
    ap.add_argument("--timed", type=int, default=40, help="searches timed, each after a prompt pass")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads of the prompt pass")
    ap.add_argument("--ivf", default="", help="also inverted files with these list counts (comma list)")
    ap.add_argument("--nprobe", default="8,16,32,64", help="lists probed (with --ivf / --ivf-native)")
    ap.add_argument("--ivf-native", default="", help="the product's inverted file (method/ivf_index.py: masked "
                    "Hamming, contiguous lists, one native call each) with these list counts (comma list)")
    ap.add_argument("--ivf-candidates", type=int, default=256, help="rows an --ivf-native probe proposes")
    ap.add_argument("--no-graph", action="store_true", help="skip the usearch graphs")
    args = ap.parse_args(argv)

    from miita_edge import _native
    from miita_edge.method import ann_index
    from miita_edge.method.ivf_index import IvfIndex
    from miita_edge.runtime.engine import Engine, EngineConfig

    work = Path(tempfile.mkdtemp(prefix="miita-ann-breadth-"))
    eng = Engine(None, EngineConfig(n_threads=args.threads))
    try:
        tm = ann.template_memory(eng, "default", args.data, work)
        k, texts = ann.real_keys(eng, tm.m, args.data, max(args.queries, args.timed))
        bank = tm.m.bank
        bits = bank.key_dim
        B = np.packbits(np.stack([bank.prepare_key(x) for x in k["train_raw"]]) >= 0, axis=1)
        Bu = np.unpackbits(B, axis=1, count=bits).astype(np.int16)
        lab = k["train_label"]
        d = float(np.median(-ann.nearest_same_label(Bu, lab, lambda Y: -(Y[:, None, :] != Y[None, :, :]).sum(-1) / bits)))
        flip = (1 - np.sqrt(1 - 2 * d)) / 2
        rng = np.random.default_rng(args.rows)
        rows = np.empty((args.rows, B.shape[1]), np.uint8)
        for s in range(0, args.rows, 50_000):
            n = min(50_000, args.rows - s)
            c = np.unpackbits(B[rng.integers(0, len(B), n)], axis=1, count=bits).astype(bool)
            rows[s:s + n] = np.packbits(c ^ (rng.random((n, bits), np.float32) < flip), axis=1)
        Q = np.stack([bank.prepare_key(x) for x in k["test_raw"][: args.queries]]).astype(np.float32)
        Q /= np.linalg.norm(Q, axis=1, keepdims=True)
        root = np.sqrt(bits)
        exact_top = [np.lexsort((np.arange(len(rows)), -(_native.bit_scores(rows, q) / root)))[:8] for q in Q]
        prompts = [eng.tokenize(tm.m.template.render_prompt(t)) for t in texts[: args.timed]]
        print(f"# bench/ann_breadth.py  cpu={os.cpu_count()}  threads={args.threads}  rows {args.rows:,} of {bits} bits "
              f"(clustered, flip rate {flip:.3f})  graph connectivity {ann_index.CONNECTIVITY}, expansion_add "
              f"{ann_index.EXPANSION_ADD}; recall of the exact top-8 over {len(Q)} real test keys; search times: "
              f"medians of {len(prompts)}, each right after a prompt pass")
        settings = [tuple(int(v) for v in s.split(":")) for s in args.settings.split(",")]
        widths = [] if args.no_graph else [bits] + [int(p) for p in args.prefixes.split(",") if 0 < int(p) < bits]
        for width in widths:
            t0 = time.perf_counter()
            graph = ann_index.AnnIndex.build(np.ascontiguousarray(rows[:, : width // 8]), "bits")
            build = time.perf_counter() - t0
            for count, ef in settings:
                recall = float(np.mean([np.isin(top, graph.candidates(q[:width], count, ef)).mean()
                                        for top, q in zip(exact_top, Q)]))
                graph.graph.expansion_search = ef
                p, s = after_prompt_passes(eng, prompts, lambda i: graph.graph.search(
                    ann_index._query_vector(Q[i % len(Q)][:width], "bits"), count, threads=1))
                print(f"   key bits {width:5d}  candidates {count:4d}  breadth {ef:4d}:  recall {recall:.4f} "
                      f"({'>=' if recall >= 0.99 else '< '} 0.99)  search alone {s:5.3f} ms = {100 * s / p:4.2f}% of "
                      f"the prompt pass ({p:5.1f} ms)  [graph built in {build:4.1f} s]", flush=True)
        for nlist in [int(x) for x in args.ivf.split(",") if x]:
            t0 = time.perf_counter()
            cent, starts, order = inverted_file(rows, bits, nlist, rng)
            build = time.perf_counter() - t0
            lists = np.ascontiguousarray(rows[order])
            for nprobe in [int(x) for x in args.nprobe.split(",")]:
                def probe(q):
                    best = np.argpartition(-_native.bit_scores(cent, q), nprobe)[:nprobe]
                    return np.concatenate([np.arange(starts[c], starts[c + 1]) for c in best])
                found = [order[probe(q)] for q in Q]
                recall = float(np.mean([np.isin(top, f).mean() for top, f in zip(exact_top, found)]))
                scanned = float(np.mean([len(f) for f in found]))
                p, s = after_prompt_passes(eng, prompts, lambda i: _native.bit_scores(
                    lists[probe(Q[i % len(Q)])], Q[i % len(Q)]))
                print(f"   inverted file  lists {nlist:5d}  probed {nprobe:3d} ({scanned:6.0f} rows scanned):  recall "
                      f"{recall:.4f} ({'>=' if recall >= 0.99 else '< '} 0.99)  centroids + lists {s:5.3f} ms = "
                      f"{100 * s / p:4.2f}% of the prompt pass ({p:5.1f} ms)  [built in {build:4.1f} s]", flush=True)
        for nlist in [int(x) for x in args.ivf_native.split(",") if x]:
            t0 = time.perf_counter()
            ivf = IvfIndex.build(rows, threads=0, nlist=nlist)
            build = time.perf_counter() - t0
            for nprobe in [int(x) for x in args.nprobe.split(",")]:
                found = [ivf.candidates(q, args.ivf_candidates, nprobe) for q in Q]
                recall = float(np.mean([np.isin(top, f).mean() for top, f in zip(exact_top, found)]))
                p, s = after_prompt_passes(eng, prompts, lambda i: ivf.candidates(Q[i % len(Q)], args.ivf_candidates,
                                                                                nprobe))
                print(f"   native inverted file  lists {nlist:5d}  probed {nprobe:3d} (~{nprobe * len(rows) / nlist:6.0f} "
                      f"rows)  candidates {args.ivf_candidates}:  recall {recall:.4f} ({'>=' if recall >= 0.99 else '< '} "
                      f"0.99)  probe {s:5.3f} ms = {100 * s / p:4.2f}% of the prompt pass ({p:5.1f} ms)  "
                      f"[built in {build:5.1f} s]", flush=True)
    finally:
        eng.close()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


def after_prompt_passes(eng, prompts: list, search) -> tuple[float, float]:
    """Medians (ms) of the prompt pass and of ``search(i)`` run right after the i-th pass (caches as an
    ask leaves them)."""
    prompt_ms, search_ms = [], []
    for i, toks in enumerate(prompts):
        t0 = time.perf_counter()
        eng.query(toks)
        t1 = time.perf_counter()
        search(i)
        t2 = time.perf_counter()
        prompt_ms.append((t1 - t0) * 1e3)
        search_ms.append((t2 - t1) * 1e3)
    return statistics.median(prompt_ms), statistics.median(search_ms)


def inverted_file(rows: np.ndarray, bits: int, nlist: int, rng, rounds: int = 2, chunk: int = 20_000):
    """(centroids (nlist, bytes) packed, list starts (nlist + 1,), row order grouping the lists)."""
    def nearest(cent):
        C = np.unpackbits(cent, axis=1, count=bits).astype(np.float32) * 2 - 1
        out = np.empty(len(rows), np.int64)
        for s in range(0, len(rows), chunk):
            X = np.unpackbits(rows[s:s + chunk], axis=1, count=bits).astype(np.float32) * 2 - 1
            out[s:s + chunk] = np.argmax(X @ C.T, axis=1)  # most agreeing signs = least Hamming distance
        return out

    cent = rows[rng.choice(len(rows), nlist, replace=False)].copy()
    for _ in range(rounds):
        assign = nearest(cent)
        for c in range(nlist):
            member = assign == c
            if member.any():
                cent[c] = np.packbits(np.unpackbits(rows[member], axis=1, count=bits).sum(0) * 2 >= member.sum())
    assign = nearest(cent)
    order = np.argsort(assign, kind="stable")
    return cent, np.searchsorted(assign[order], np.arange(nlist + 1)), order


if __name__ == "__main__":
    sys.exit(main())
