"""The memory without the language model: stage-by-stage learning under a byte budget, scored by
the anchor vote, from keys extracted once by ``bench/keys.py extract``.

Why: a key design, a repair policy or a relevance rule changes what the memory keeps and what it
retrieves, and the vote over what it retrieves is the ceiling that generation follows (on
Banking77 the steered answer equals the vote on 96-99% of queries: the lab notebook,
``git show f98d7e6:docs/method.md``, §4 and §10.2). One run of
the real bench costs minutes to hours; this replays the same stream through the real
``MemoryBank`` (same writes, same repair, same byte accounting up to the store's framing) in
seconds, so designs can be compared on every benchmark and budget before one is built.

    python bench/memsim.py --cache bench-results/keys --benchmarks banking77,dsc --budgets 1%,5%,20%,none

Keys: ``--layer K`` (default: the engine's middle layer, 9 on Gemma-3-270M), centred on the
calibration mean of that layer (model + template only). Framing: ``--framing BYTES`` is what the
store adds to the arrays' payload (1,368 B for format 1 at Banking77 1%; see docs/RESULTS.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keys import guard, load  # noqa: E402

TEMPLATES = {"banking77": "banking77", "dsc": "dsc", "xquad": "qa", "superni": "superni"}


def answer_tokens(outputs: list[str], template: str, model=None) -> list[np.ndarray]:
    """The answer tokens the memory stores for each output (the template's target, as ingest does)."""
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig

    tpl = get_template(template)
    eng = Engine(model, EngineConfig(n_threads=1))
    try:
        cache: dict[str, np.ndarray] = {}
        out = []
        for y in outputs:
            if y not in cache:
                cache[y] = np.asarray(eng.tokenize(tpl.render_target(y), add_bos=False), np.int32)
            out.append(cache[y])
        return out
    finally:
        eng.close()


def npy_bytes(arrays: dict) -> int:
    """The arrays' payload bytes (shape-only views count at their full size); ``--framing`` adds
    the store's own bytes."""
    return sum(int(np.asarray(a).nbytes) for a in arrays.values())


def write_and_repair(sim, tokens, key, limit: int | None, log: dict) -> None:
    """Write one example into ``sim.bank`` and repair it to ``limit`` bytes of ``sim.size()``,
    as ingest does, adding the repair's counts to ``log``."""
    sim.bank.write(np.zeros((0, sim.bank.n_embd), np.float32), tokens, key)
    if limit is not None:
        r = sim.bank.repair(limit, lambda b: sim.size())
        for f in log:
            log[f] += getattr(r, f)


class Sim:
    """One memory learning a benchmark's stages in order; ``vote(queries)`` answers without an LM."""

    def __init__(self, bank_config, H: int, framing: int, k: int = 8, T: float = 0.02):
        from miita_edge.memory.bank import MemoryBank

        self.bank = MemoryBank(bank_config, H, None)
        self.framing, self.k, self.T = framing, k, T
        self.label_of: dict[tuple, str] = {}
        self.radius: dict[tuple, float] = {}
        self.gate = False  # relevance gate: recurring answers whose radius the query reaches
        self.gate_stats = [0, 0]  # queries seen, queries gated off

    def size(self) -> int:
        return npy_bytes(self.bank.to_arrays(shapes_only=True)) + self.framing

    def learn(self, keys: np.ndarray, tokens: list[np.ndarray], labels: list[str], limit: int | None) -> dict:
        log = {"pruned": 0, "merged": 0, "evicted": 0}
        for k, t, lab in zip(keys, tokens, labels):
            key = tuple(int(x) for x in t)
            self.label_of[key] = lab
            # the answer's radius: the lowest similarity with which one of its examples joined the
            # anchors it already had (stored form against stored form)
            p = next((p for p in self.bank.protos if tuple(int(x) for x in p.tokens) == key), None)
            if p is not None:
                sk = self.bank.store_key(self.bank.prepare_key(k))[0]
                c = self.bank._max_anchor_cos(p.anchors, sk)
                self.radius[key] = min(self.radius.get(key, np.inf), c)
            write_and_repair(self, t, k, limit, log)
        return log

    hub = 0.0  # CSLS-style hubness correction: score = cos(q, a) - hub * r_a (0: plain cosine)
    hub_k = 10

    centroids = False  # one extra anchor per answer: the stored form of the mean of all its keys

    def _index(self):
        A, owner = self.bank.anchor_matrix()
        if self.centroids and len(A):
            # derived from what is stored (anchors and their counts), so it costs no budget bytes
            C = np.stack([self.bank.store_key((p.anchor_n[:, None] * p.anchors).sum(0))[0] for p in self.bank.protos])
            A = np.concatenate([A, C])
            owner = np.concatenate([owner, np.arange(len(C))])
        U = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
        r = np.zeros(len(U))
        if self.hub and len(U) > 1:
            G = U @ U.T
            np.fill_diagonal(G, -np.inf)
            kk = min(self.hub_k, len(U) - 1)
            r = np.sort(G, axis=1)[:, -kk:].mean(1)
        return U, owner, r

    def retrieve(self, q: np.ndarray, index=None):
        from miita_edge.method.steering import knn_prototypes

        U, owner, r = index or self._index()
        qq = self.bank.prepare_key(q)
        s = U @ (qq / max(float(np.linalg.norm(qq)), 1e-12)) - self.hub * r
        return knn_prototypes(None, None, owner, self.k, self.T, scores=s)

    def vote(self, queries: np.ndarray) -> list[str | None]:
        from miita_edge.method.steering import vote

        labels = [self.label_of[tuple(int(x) for x in p.tokens)] for p in self.bank.protos]
        out = []
        index = self._index()
        for q in queries:
            ids, w, _ = self.retrieve(q, index)
            if self.gate:
                ids, w = self.relevant(q, ids, w)
                self.gate_stats[0] += 1
                if len(ids) == 0:
                    self.gate_stats[1] += 1
                    out.append(None)
                    continue
            out.append(vote(ids, w, labels))
        return out

    def relevant(self, q, ids, w):
        """The retrieved prototypes that pass the relevance gate: an answer taught at least twice,
        and the query (in stored form) at least as close to one of its anchors as the answer's
        loneliest example was to its siblings; or an exact repeat of a stored key."""
        sq = self.bank.store_key(self.bank.prepare_key(q))[0]
        keep = []
        for j in ids:
            p = self.bank.protos[j]
            key = tuple(int(x) for x in p.tokens)
            c = self.bank._max_anchor_cos(p.anchors, sq)
            ok = c >= 1 - 1e-6 or (p.n >= 2 and c >= self.radius.get(key, np.inf))
            keep.append(ok)
        keep = np.array(keep, bool)
        if not keep.any():
            return ids[:0], w[:0]
        return ids[keep], w[keep] / w[keep].sum()


def learned_stream_bytes(data: Path, bench: str, n_train: int) -> int:
    """UTF-8 bytes of the learned training rows (inputs + outputs): what a fractional budget is of,
    as the bench runner resolves it (the sweep's subsample, bench/sweep.py LIMITS)."""
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.streams import stream_bytes
    from sweep import DATA_DIRS, LIMITS

    tr_lim, te_lim = LIMITS[bench]
    _, stages = load_benchmark(get_benchmark(bench), data / DATA_DIRS[bench], limit_test=te_lim, limit_train=tr_lim)
    rows = [e for s in stages for e in s.train]
    if len(rows) != n_train:
        raise SystemExit(f"{bench}: {n_train} training keys cached but {len(rows)} rows in {data}")
    return stream_bytes(rows)


class PresetSim:
    """The real thing minus the LM: a preset's bank (key layers, centring, coordinate order, radius,
    narrowing) written by ``MemoryBank.write`` + ``repair`` and read by ``plan_query`` (anchor vote,
    centroids, relevance gate), with the answer of the vote in place of generation."""

    def __init__(self, preset, K: np.ndarray, calib: np.ndarray, layers: list[int], framing: int):
        from miita_edge.memory.bank import MemoryBank
        from miita_edge.method.calibration import key_order

        self.preset, self.layers, self.framing = preset, layers, framing
        H = K.shape[2]
        ck = np.concatenate([calib[:, l] for l in layers], axis=1)
        mean = ck.mean(0) if preset.center_keys else None
        order = key_order(ck, len(layers)) if preset.key_order == "calibration" else None
        self.bank = MemoryBank(preset.bank, H, mean, len(layers), order)
        self.label_of: dict[tuple, str] = {}
        self.gate_stats = [0, 0]
        self.centroids_only = False

    def raw(self, K_rows: np.ndarray) -> np.ndarray:
        return np.concatenate([K_rows[:, l] for l in self.layers], axis=1)

    def size(self) -> int:  # array payload + the store's framing (headers, names, meta)
        return sum(a.nbytes for a in self.bank.to_arrays(shapes_only=True).values()) + self.framing

    def learn(self, raw_keys, tokens, labels, limit) -> dict:
        log = {"pruned": 0, "narrowed": 0, "merged": 0, "evicted": 0}
        for k, t, lab in zip(raw_keys, tokens, labels):
            self.label_of[tuple(int(x) for x in t)] = lab
            write_and_repair(self, t, k, limit, log)
        return log

    def vote(self, raw_queries) -> list:
        from types import SimpleNamespace
        from miita_edge.method.plan import RetrievalIndex, plan_query
        from miita_edge.method.steering import vote

        index = RetrievalIndex.build(self.bank, None, centroids=self.preset.centroid_vote)
        if self.centroids_only and index.voters is not None and len(index.packed):
            A = len(index.packed)
            index.voters, index.voter_owner = index.voters[A:], index.voter_owner[A:]
        labels = [self.label_of[tuple(int(x) for x in t)] for t in self.bank.answer_tokens()]
        out = []
        for q in raw_queries:
            qp = plan_query(self.preset, self.bank, None, index, SimpleNamespace(key=q))
            self.gate_stats[0] += 1
            if qp.gate is not None and not qp.gate.adapted:
                self.gate_stats[1] += 1
                out.append(None)
                continue
            out.append(vote(qp.ids, qp.weights, labels))
        return out


def run_preset(args, bench: str, budget: str) -> dict:
    from miita_edge.evaluation.metrics import normalize_label
    from miita_edge.memory.budget import parse_budget
    from miita_edge.method.presets import default_preset, paper_preset, preset_version

    preset = {"default": default_preset, "default-v3": lambda: preset_version("default", 3),
              "default-v2": lambda: preset_version("default", 2), "default-v1": lambda: preset_version("default", 1),
              "paper": paper_preset}[args.preset]()
    for kv in args.set:  # e.g. k_anchors=16 or retrieval.T_agg=0.05
        k, v = kv.split("=", 1)
        obj = preset
        *path, last = k.split(".")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, type(getattr(obj, last))(v))
    K, meta, split = load(args.cache, bench, args.split)
    stage = np.array(meta["stage"])
    answers = meta["answers"]
    cal = split == "calib"
    n_layer = K.shape[1] + 1
    layers = preset.key_layers(n_layer)
    # keys pooled as the preset pools them, or the replay would be of another preset: bench/keys.py
    # caches hold the mean of every layer, bench/pooling.py memsim-cache says what it holds
    cached = [meta.get("pooling", {}).get(str(k), "mean") for k in layers]
    if cached != preset.key_poolings(n_layer):
        raise SystemExit(f"{bench}: the cache {args.cache} pools layers {layers} as {cached}, the preset as "
                         f"{preset.key_poolings(n_layer)}; write a matching cache with bench/pooling.py memsim-cache")
    tr = np.flatnonzero(split == "train")
    toks = answer_tokens([answers[i][0] for i in tr], TEMPLATES[bench])
    tok_of = dict(zip(tr.tolist(), toks))
    T = len(meta["stages"])
    b = parse_budget(budget)
    limit = None if b.unlimited else b.resolve(learned_stream_bytes(args.data, bench, len(tr)))
    sim = PresetSim(preset, K, K[cal], layers, args.framing)
    sim.centroids_only = args.centroids_only
    A = np.full((T, T), np.nan)
    t0 = time.perf_counter()
    logs = []
    first_stage: dict[str, int] = {}
    for t in range(T):
        rows = tr[stage[tr] == t]
        for i in rows:
            first_stage.setdefault(normalize_label(answers[i][0]), t)
        logs.append(sim.learn(sim.raw(K[rows]), [tok_of[i] for i in rows],
                              [normalize_label(answers[i][0]) for i in rows], limit))
        if getattr(args, "label_anchors", False):  # are anchors balanced across old and new answers?
            per: dict[int, list[int]] = {}
            for p in sim.bank.protos:
                lab = sim.label_of[tuple(int(x) for x in p.tokens)]
                per.setdefault(first_stage[lab], []).append(len(p.anchors))
            print(f"# {bench} {budget} after stage {t + 1}: anchors per answer by the stage that introduced it "
                  + " ".join(f"{s + 1}:{np.mean(v):.1f}" for s, v in sorted(per.items())), flush=True)
        for tau in range(T):
            if tau != t and tau != t + 1 and t != T - 1:
                continue
            te = np.flatnonzero((split == "test") & (stage == tau))
            pred = sim.vote(sim.raw(K[te]))
            A[t, tau] = 100.0 * np.mean([p is not None and p in [normalize_label(g) for g in answers[i]]
                                         for p, i in zip(pred, te)])
    op = float(np.mean(A[T - 1]))
    bwt = float(np.mean([A[T - 1, i] - A[i, i] for i in range(T - 1)])) if T > 1 else 0.0
    return {"bench": bench, "preset": args.preset, "budget": budget, "limit": limit, "op": round(op, 2),
            "bwt": round(bwt, 2), "final": [round(x, 1) for x in A[T - 1]], "diag": [round(A[i, i], 1) for i in range(T)],
            "bytes": sim.size(), "gated_off": round(sim.gate_stats[1] / max(sim.gate_stats[0], 1), 3),
            "protos": sim.bank.n_prototypes, "anchors": sim.bank.n_anchors, "key_dim": sim.bank.key_dim,
            "seconds": round(time.perf_counter() - t0, 1), "repair": {k: sum(l[k] for l in logs) for k in logs[0]}}


def run(args, bench: str, budget: str) -> dict:
    if args.preset:
        return run_preset(args, bench, budget)
    from miita_edge.evaluation.metrics import normalize_label
    from miita_edge.memory.bank import BankConfig
    from miita_edge.memory.budget import parse_budget

    K, meta, split = load(args.cache, bench, args.split)
    stage = np.array(meta["stage"])
    answers = meta["answers"]
    cal = split == "calib"
    parts = []
    layers = [int(x) for x in str(args.layer).split("+")]
    for layer in layers:
        x = K[:, layer] - K[cal, layer].mean(0)  # centred on the calibration mean (not stored)
        if len(layers) > 1:  # each layer's part at unit norm, so neither dominates the cosine
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        parts.append(x)
    X = np.concatenate(parts, axis=1)
    if args.rotate:  # a fixed random rotation before the sign: SimHash bits instead of coordinate signs
        Q, _ = np.linalg.qr(np.random.default_rng(args.rotate).standard_normal((X.shape[1], X.shape[1])))
        X = X @ Q.astype(np.float32)
    if args.dims:
        X = np.ascontiguousarray(X[:, :args.dims])
    tr = np.flatnonzero(split == "train")
    outputs = [answers[i][0] for i in tr]
    toks = answer_tokens(outputs, TEMPLATES[bench])
    tok_of = dict(zip(tr.tolist(), toks))
    T = len(meta["stages"])
    b = parse_budget(budget)
    limit = None if b.unlimited else b.resolve(learned_stream_bytes(args.data, bench, len(tr)))
    sim = Sim(BankConfig(payload="tokens", key_precision=args.key_precision), X.shape[1], args.framing,
              args.k, args.T)
    sim.hub = args.hub
    if args.repair == "balanced":
        import types
        from miita_edge.memory.prototype import unit_rows as _unit_rows

        def prune_balanced(bank):
            """Fold within the prototype that has the most anchors (ties: the closest pair)."""
            best = (-1, -np.inf, -1, -1)
            for j, p in enumerate(bank.protos):
                a = len(p.anchors)
                if a < 2 or a < best[0]:
                    continue
                U = _unit_rows(p.anchors)
                G = U @ U.T
                np.fill_diagonal(G, -np.inf)
                r, c = np.unravel_index(int(np.argmax(G)), G.shape)
                if (a, G[r, c]) > (best[0], best[1]):
                    G2 = np.where(np.isfinite(G), G, 0.0)
                    victim = r if G2[r].sum() >= G2[c].sum() else c
                    best = (a, float(G[r, c]), j, int(victim))
            if best[2] < 0:
                return False
            bank.fold_anchor(bank.protos[best[2]], best[3])
            return True
        sim.bank.prune_one_anchor = types.MethodType(prune_balanced, sim.bank)
    sim.gate = args.gate
    sim.centroids = args.centroids
    A = np.full((T, T), np.nan)
    t0 = time.perf_counter()
    logs = []
    for t in range(T):
        rows = tr[stage[tr] == t]
        logs.append(sim.learn(X[rows], [tok_of[i] for i in rows], [normalize_label(answers[i][0]) for i in rows],
                              limit))
        for tau in range(T):
            if tau != t and tau != t + 1 and t != T - 1:
                continue
            te = np.flatnonzero((split == "test") & (stage == tau))
            pred = sim.vote(X[te])
            A[t, tau] = 100.0 * np.mean([p is not None and p in [normalize_label(g) for g in answers[i]]
                                         for p, i in zip(pred, te)])
    op = float(np.mean(A[T - 1]))
    bwt = float(np.mean([A[T - 1, i] - A[i, i] for i in range(T - 1)])) if T > 1 else 0.0
    return {"bench": bench, "budget": budget, "limit": limit, "op": round(op, 2), "bwt": round(bwt, 2),
            "final": [round(x, 1) for x in A[T - 1]], "diag": [round(A[i, i], 1) for i in range(T)], "bytes": sim.size(),
            "gated_off": round(sim.gate_stats[1] / max(sim.gate_stats[0], 1), 3), "protos": sim.bank.n_prototypes, "anchors": sim.bank.n_anchors, "seconds": time.perf_counter() - t0,
            "repair": {k: sum(l[k] for l in logs) for k in logs[0]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("bench-results/keys"))
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--benchmarks", default="banking77,dsc")
    ap.add_argument("--budgets", default="1%,5%,20%,none")
    ap.add_argument("--preset", default=None, choices=("default", "default-v3", "default-v2", "default-v1", "paper"),
                    help="replay with a preset's real bank and retrieval (key layers, order, radius, narrowing, "
                         "centroids, relevance gate); the other key options are then ignored")
    ap.add_argument("--set", action="append", default=[], help="preset override, e.g. k_anchors=16")
    ap.add_argument("--centroids-only", action="store_true", help="with --preset: vote over the centroids alone")
    ap.add_argument("--label-anchors", action="store_true",
                    help="with --preset: after each stage, print the mean anchors per answer by the stage that introduced it")
    ap.add_argument("--layer", default="9", help="key layer, or layers joined by + (e.g. 9+12)")
    ap.add_argument("--key-precision", default="bit")
    ap.add_argument("--rotate", type=int, default=0, help="seed of a random rotation applied to the keys (0: none)")
    ap.add_argument("--framing", type=int, default=1368)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--dims", type=int, default=0, help="keep the first DIMS (rotated) dimensions of each key")
    ap.add_argument("--gate", action="store_true", help="apply the relevance gate (recurrence + per-answer radius)")
    ap.add_argument("--repair", default="paper", choices=("paper", "balanced"),
                    help="which anchor to fold first: the closest pair anywhere (paper order) or within the "
                         "answer holding the most anchors")
    ap.add_argument("--centroids", action="store_true", help="vote over per-answer centroids too")
    ap.add_argument("--hub", type=float, default=0.0, help="hubness correction weight (CSLS: 0.5)")
    ap.add_argument("--T", type=float, default=0.02)
    from miita_edge.evaluation.splits import add_split_arguments

    add_split_arguments(ap)
    args = ap.parse_args(argv)
    guard(args, "bench/memsim.py")
    for b in args.benchmarks.split(","):
        for budget in args.budgets.split(","):
            r = run(args, b, budget)
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
