"""Which keys tell answers apart: a probe over all stages of all four benchmarks.

Two steps, so that the expensive one runs once:

    python bench/keys.py extract --data ../shared/data --out bench-results/keys   # prompt passes
    python bench/keys.py eval --cache bench-results/keys                           # numpy only

``extract`` decodes every training and evaluated prompt of every stage once (the sweep's subsample:
bench/sweep.py LIMITS; the evaluated rows are the dev rows, ``--split dev``, unless
``--split test --report-on-test`` asks for the test rows) and keeps the BOS-less mean of *every* layer's output ``l_out-<k>``
(k = 0 .. n_layer-2, one prompt pass: the native callback sums several key tensors at once), plus
the same for the calibration inputs through each benchmark's template. ``eval`` then scores key
designs without a language model, as the memory would use them after the final stage:

* **vote**: the top-k anchor vote (``steering.knn_prototypes`` + ``vote``, k = 8, T = 0.02, the
  default preset's) over *all* stored training rows of all stages, scored against the test
  row's gold answer (normalised) — the label-vote ceiling of retrieval alone;
* **stage**: the share of a test row's top-8 neighbours from its own stage (the domain, language
  or task): what a relevance decision and the anchor vote rest on for generation tasks.

Nothing here reads a test row to build a key: centring vectors come from the calibration inputs
(model + template only), projections from the model's own structure or a fixed seed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import DATA_DIRS, LIMITS  # noqa: E402

BENCHES = ("banking77", "dsc", "xquad", "superni")


def guard(args, script: str) -> None:
    """Refuse ``--split test`` without ``--report-on-test``: these scripts explore settings."""
    from miita_edge.evaluation.splits import exit_unless_tuning_split

    exit_unless_tuning_split(args, script)


def cache_file(folder: Path, b: str, split: str) -> Path:
    """A probe cache's file: ``B.npz`` for test rows (as caches were first written), ``B.dev.npz``."""
    return folder / (f"{b}.npz" if split == "test" else f"{b}.{split}.npz")


def uncached(args):
    """(benchmark, cache path) for each of ``--benchmarks`` not yet extracted into ``--out``: an
    interrupted extraction resumes at the first benchmark it had not finished."""
    for b in args.benchmarks.split(","):
        path = cache_file(args.out, b, args.split)
        if path.exists():
            print(f"{b}: cached at {path}", flush=True)
            continue
        yield b, path


def extract(args) -> int:
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.runtime.engine import Engine, EngineConfig

    guard(args, "bench/keys.py")
    eng = Engine(args.model, EngineConfig(n_threads=args.threads))
    layers = list(range(0, eng.n_layer - 1))
    eng.set_key_layers(layers)
    args.out.mkdir(parents=True, exist_ok=True)
    for b, path in uncached(args):
        spec, tpl, stages, rows = probe_rows(b, args.data, args.split)
        K = np.zeros((len(rows), len(layers), eng.n_embd), np.float32)
        t0 = time.perf_counter()
        for i, (_, _, x, _) in enumerate(rows):
            st = eng.query(prompt_tokens(eng, tpl, x, spec.max_prompt_tokens))
            K[i] = st.keys
            if (i + 1) % 200 == 0:
                print(f"  {b}: {i + 1}/{len(rows)} prompts, {time.perf_counter() - t0:.0f} s", flush=True)
        meta = {"benchmark": b, "layers": layers, "stages": [s.name for s in stages],
                "split": [r[0] for r in rows], "stage": [r[1] for r in rows], "answers": [r[3] for r in rows],
                "model": eng.info.path.name, "seconds": time.perf_counter() - t0, "eval_split": args.split}
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=K.astype(np.float16) if args.f16 else K, meta=json.dumps(meta))
        tmp.replace(path)
        print(f"{b}: {len(rows)} prompts x {len(layers)} layers in {meta['seconds']:.0f} s -> {path}", flush=True)
    eng.close()
    return 0


def probe_rows(b: str, data: Path, split: str = "dev"):
    """(benchmark spec, template, stages, rows) of the sweep's subsample of benchmark ``b``: rows are
    (kind, stage index, input, answer(s)) for every training and evaluated row of every stage, then
    the calibration inputs (kind "calib", stage -1), in the order the probes store their keys. The
    evaluated rows are ``split``'s (dev: held-out training rows) and carry kind "test" (what the
    probe scores); the training rows never include dev rows."""
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.method.calibration import CALIBRATION_INPUTS
    from miita_edge.method.templates import get_template

    spec = get_benchmark(b)
    tr_lim, te_lim = LIMITS[b]
    _, stages = load_benchmark(spec, data / DATA_DIRS[b], limit_test=te_lim, limit_train=tr_lim, split=split)
    rows = []
    for si, s in enumerate(stages):
        rows += [("train", si, e.input, [e.output]) for e in s.train]
        rows += [("test", si, it.example.input, list(it.golds)) for it in s.test]
    rows += [("calib", -1, x, [""]) for x in CALIBRATION_INPUTS]
    return spec, get_template(spec.template), stages, rows


def probe_split(meta: dict):
    """(train mask, test mask, calibration mask, stage of each row, normalised training labels,
    normalised gold answers of each test row) of a probe cache's ``meta``."""
    from miita_edge.evaluation.metrics import normalize_label

    split, answers = np.array(meta["split"]), meta["answers"]
    tr, te, cal = split == "train", split == "test", split == "calib"
    labels = [normalize_label(answers[i][0]) for i in np.flatnonzero(tr)]
    golds = [[normalize_label(g) for g in answers[i]] for i in np.flatnonzero(te)]
    return tr, te, cal, np.array(meta["stage"]), labels, golds


def probe_parser(doc: str, results: str, threads: int):
    """The probes' command line: (parser, its subparsers, ``extract``'s, ``eval``'s), with the options
    both probes share; ``results`` names the cache folder under bench-results/."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    x = sub.add_parser("extract")
    x.add_argument("--data", type=Path, default=Path("../shared/data"))
    x.add_argument("--out", type=Path, default=Path("bench-results") / results)
    x.add_argument("--benchmarks", default=",".join(BENCHES))
    x.add_argument("--model", default=None)
    x.add_argument("--threads", type=int, default=threads, help="llama.cpp threads (0: all cores)")
    e = sub.add_parser("eval")
    e.add_argument("--cache", type=Path, default=Path("bench-results") / results)
    e.add_argument("--benchmarks", default=",".join(BENCHES))
    from miita_edge.evaluation.splits import add_split_arguments

    add_split_arguments(x)
    add_split_arguments(e)
    return ap, sub, x, e


def load(cache: Path, b: str, split: str = "dev"):
    """(keys, meta, row kinds) of a probe cache, refused if its evaluated rows are not ``split``'s."""
    z = np.load(cache_file(cache, b, split))
    meta = json.loads(str(z["meta"]))
    if meta.get("eval_split", "test") != split:  # caches written before the dev split hold test rows
        raise SystemExit(f"{cache_file(cache, b, split)}: holds {meta.get('eval_split', 'test')} rows, not {split}")
    K = z["keys"].astype(np.float32)
    split = np.array(meta["split"])
    return K, meta, split


def vote_scores(Q: np.ndarray, A: np.ndarray, labels: list, k: int = 8, T: float = 0.02,
                bits: bool = False) -> list:
    """The anchor vote's answer for every query (unit rows; ``bits``: rows are ±1 already)."""
    from miita_edge.method.steering import knn_prototypes, vote

    uniq = sorted(set(labels))
    owner = np.array([uniq.index(l) for l in labels])
    An = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    Qn = Q / np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-12)
    S = Qn @ An.T
    out = []
    for s in S:
        ids, w, _ = knn_prototypes(None, None, owner, k, T, scores=s)
        out.append(vote(ids, w, uniq))
    return out


def neighbour_stage_share(Q, A, q_stage, a_stage, k=8) -> float:
    An = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    Qn = Q / np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-12)
    top = np.argsort(-(Qn @ An.T), axis=1)[:, :k]
    return float((a_stage[top] == q_stage[:, None]).mean())


def score(Q: np.ndarray, A: np.ndarray, labels: list, golds: list, q_stage, a_stage) -> tuple[float, float]:
    """(vote accuracy %, own-stage neighbours %) of float queries ``Q`` against stored rows ``A``."""
    pred = vote_scores(Q, A, labels)
    acc = 100.0 * float(np.mean([p in g for p, g in zip(pred, golds)]))
    return acc, 100.0 * neighbour_stage_share(Q, A, q_stage, a_stage)


def design_keys(K: np.ndarray, calib: np.ndarray, design: dict) -> np.ndarray:
    """Rows of K (n, L, H) -> the key vectors a design stores, as floats (bits as ±1)."""
    layers = design["layers"]
    parts = []
    for li in layers:
        x = K[:, li] - (calib[:, li].mean(0) if design.get("centre", True) else 0.0)
        if design.get("whiten") == "calib_diag":  # per-dimension scale of the calibration keys
            x = x / np.maximum(calib[:, li].std(0), 1e-3 * calib[:, li].std(0).max())
        if design.get("unit_layers") and len(layers) > 1:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        parts.append(x)
    x = np.concatenate(parts, axis=1)
    proj = design.get("proj")
    if proj is not None:
        x = x @ proj
    prec = design.get("prec", "float32")
    if prec == "bit":
        x = np.where(x >= 0, 1.0, -1.0)
    return x


def evaluate(args) -> int:
    results = {}
    guard(args, "bench/keys.py")
    for b in args.benchmarks.split(","):
        if not cache_file(args.cache, b, args.split).exists():
            print(f"{b}: not extracted yet")
            continue
        K, meta, _ = load(args.cache, b, args.split)
        tr, te, cal, stage, labels, golds = probe_split(meta)
        H = K.shape[2]
        L = K.shape[1]
        rng = np.random.default_rng(0)
        designs = {}
        for li in args.layers:
            if li >= L:
                continue
            designs[f"l{li} f32"] = {"layers": [li]}
            designs[f"l{li} bit"] = {"layers": [li], "prec": "bit"}
        for combo in args.combos:
            ls = [int(c) for c in combo.split("+")]
            designs[f"l{combo} f32"] = {"layers": ls, "unit_layers": True}
            designs[f"l{combo} bit"] = {"layers": ls, "unit_layers": True, "prec": "bit"}
        for m in args.simhash:
            for li in args.simhash_layers:
                ls = [int(c) for c in str(li).split("+")]
                R = rng.standard_normal((H * len(ls), m)).astype(np.float32)
                designs[f"l{li} simhash{m}"] = {"layers": ls, "proj": R, "prec": "bit", "unit_layers": True}
                designs[f"l{li} simhash{m} wd"] = {"layers": ls, "proj": R, "prec": "bit", "unit_layers": True,
                                                   "whiten": "calib_diag"}
        print(f"\n# {b}: {tr.sum()} anchors ({len(meta['stages'])} stages), {te.sum()} queries")
        for name, d in designs.items():
            X = design_keys(K, K[cal], d)
            # queries are never quantised: the memory compares a float query with stored anchors
            Xq = design_keys(K[te], K[cal], {**d, "prec": "float32"})
            acc, share = score(Xq, X[tr], labels, golds, stage[te], stage[tr])
            results[(b, name)] = (acc, share)
            print(f"  {name:18s} vote {acc:5.1f}%   own-stage neighbours {share:5.1f}%", flush=True)
    return 0


def main(argv=None) -> int:
    ap, _, x, e = probe_parser(__doc__, "keys", threads=1)
    x.add_argument("--f16", action="store_true", help="store the keys as float16 (half the disk)")
    e.add_argument("--layers", type=int, nargs="*", default=[3, 6, 9, 12, 14, 15, 16])
    e.add_argument("--combos", nargs="*", default=["9+12", "6+12", "3+6+9+12+15"])
    e.add_argument("--simhash", type=int, nargs="*", default=[])
    e.add_argument("--simhash-layers", nargs="*", default=["12"])
    args = ap.parse_args(argv)
    return extract(args) if args.cmd == "extract" else evaluate(args)


if __name__ == "__main__":
    sys.exit(main())
