"""Which prompt rows a key should pool, layer by layer: a probe over all four benchmarks.

The default preset pools the mean of every prompt row but BOS at both key layers (12 and 9 on
Gemma-3-270M). ``bench/keys.py`` chose the layers with that pooling fixed; this probes the pooling
itself, per layer, because the two layers may want different rows: the last prompt row (the
template's answer cue) is where the model has gathered what it is about to say, while the mean
keeps the input's content.

    python bench/pooling.py extract --data ../shared/data     # prompt passes, cached per benchmark
    python bench/pooling.py eval                              # numpy only
    python bench/pooling.py memsim-cache --deep last --mid mean --out bench-results/pooling-last-mean
    python bench/memsim.py --cache bench-results/pooling-last-mean --preset default ...   # the real bank

``extract`` decodes every training, test and calibration prompt of the sweep's subsample
(``bench/sweep.py`` LIMITS, as ``bench/keys.py``) once per pooling, with the default preset's key
layers, and keeps each layer's pooled key:

* ``mean``: every row but BOS (what ships), ``last``: the last prompt row only,
* ``last4``: the last four rows, ``half``: the second half of the rows.

``eval`` scores every pairing (deep layer pooled one way, middle layer another) as
``bench/keys.py`` scores designs: each block centred on the calibration keys of the same pooling
and at unit norm, 1-bit anchors against a float query, the top-8 vote (T = 0.02) over all stored
training rows after the last stage, and the share of each query's top-8 neighbours from its own
stage (domain, language or task), which the relevance gate leans on.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from miita_edge.evaluation.splits import add_split_arguments  # noqa: E402
from keys import BENCHES, cache_file, guard, probe_parser, probe_rows, probe_split, score, uncached  # noqa: E402

#: pooling -> which rows of the shipped key mask (every prompt row but BOS) it keeps
POOLINGS = {
    "mean": lambda rows: rows,
    "last": lambda rows: rows[-1:],
    "last4": lambda rows: rows[-4:],
    "half": lambda rows: rows[len(rows) // 2:],
}


def pooling_mask(eng, tokens: list[int], pooling: str) -> list[bool]:
    rows = [i for i, keep in enumerate(eng.key_mask(tokens, True)) if keep]
    keep = set(POOLINGS[pooling](rows))
    return [i in keep for i in range(len(tokens))]


def extract(args) -> int:
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.method.presets import default_preset
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.key_pooling import key_mean

    guard(args, "bench/pooling.py")
    eng = Engine(args.model, EngineConfig(n_threads=args.threads))
    layers = list(default_preset().key_layers(eng.n_layer))
    eng.set_key_layers(layers)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for b, path in uncached(args):
            spec, tpl, stages, rows = probe_rows(b, args.data, args.split)
            toks = [prompt_tokens(eng, tpl, x, spec.max_prompt_tokens) for _, _, x, _ in rows]
            out = {}
            t0 = time.perf_counter()
            for name in POOLINGS:
                K = np.zeros((len(rows), len(layers), eng.n_embd), np.float32)
                for i, t in enumerate(toks):
                    s, n = eng.prompt_key(t, pooling_mask(eng, t, name))
                    K[i] = key_mean(s, n).reshape(len(layers), eng.n_embd)
                out[name] = K
                print(f"  {b}: {name} pooled, {time.perf_counter() - t0:.0f} s", flush=True)
            meta = {"benchmark": b, "layers": layers, "split": [r[0] for r in rows], "stage": [r[1] for r in rows],
                    "answers": [r[3] for r in rows], "model": eng.info.path.name, "n_layer": eng.n_layer,
                    "stages": [s.name for s in stages], "eval_split": args.split}
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, meta=json.dumps(meta), **out)
            tmp.replace(path)
    finally:
        eng.close()
    return 0


def _open(args, b: str):
    """(arrays, meta) of one pooling cache, or None when not extracted; refused if it holds
    another split's rows."""
    path = cache_file(args.cache, b, args.split)
    if not path.exists():
        print(f"{b}: not extracted yet")
        return None
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    if meta.get("eval_split", "test") != args.split:
        raise SystemExit(f"{path}: holds {meta.get('eval_split', 'test')} rows, not {args.split}")
    return z, meta


def evaluate(args) -> int:
    guard(args, "bench/pooling.py")
    for b in args.benchmarks.split(","):
        got = _open(args, b)
        if got is None:
            continue
        z, meta = got
        tr, te, cal, stage, labels, golds = probe_split(meta)
        deep, mid = meta["layers"]
        print(f"\n# {b}: {tr.sum()} anchors, {te.sum()} queries; key layers {deep} + {mid}")
        for pd in POOLINGS:
            for pm in POOLINGS:
                blocks = []
                for name, j in ((pd, 0), (pm, 1)):
                    x = z[name][:, j] - z[name][cal, j].mean(0)
                    blocks.append(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))
                X = np.concatenate(blocks, axis=1)
                A, Q = np.where(X[tr] >= 0, 1.0, -1.0), X[te]
                acc, share = score(Q, A, labels, golds, stage[te], stage[tr])
                tag = "  (shipped)" if pd == pm == "mean" else ""
                print(f"  layer {deep} {pd:5s} + layer {mid} {pm:5s}  vote {acc:5.1f}%   own-stage neighbours "
                      f"{share:5.1f}%{tag}", flush=True)
    return 0


def n_layer_of(meta: dict, model) -> int:
    if "n_layer" in meta:
        return int(meta["n_layer"])
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(model, EngineConfig(n_threads=1))
    try:
        return eng.n_layer
    finally:
        eng.close()


def memsim_cache(args) -> int:
    """Write ``bench/keys.py``-format caches whose key layers hold one pairing's pooled keys, so that
    ``bench/memsim.py --cache OUT --preset default`` replays the real bank (budgets, repair, the
    relevance gate) with them. Only the preset's key layers are filled; the other slots are zero."""
    guard(args, "bench/pooling.py")
    args.out.mkdir(parents=True, exist_ok=True)
    for b in args.benchmarks.split(","):
        got = _open(args, b)
        if got is None:
            continue
        z, meta = got
        deep, mid = meta["layers"]
        n, _, H = z["mean"].shape
        # as many layer slots as bench/keys.py keeps (n_layer - 1): memsim derives the model's depth,
        # and so the preset's key layers, from that count
        K = np.zeros((n, n_layer_of(meta, args.model) - 1, H), np.float32)
        K[:, deep], K[:, mid] = z[args.deep][:, 0], z[args.mid][:, 1]
        stages = meta.get("stages") or [f"stage-{i + 1}" for i in range(max(meta["stage"]) + 1)]
        out = {**meta, "stages": stages, "pooling": {str(deep): args.deep, str(mid): args.mid}}
        dst = cache_file(args.out, b, args.split)
        tmp = args.out / f"{b}.tmp.npz"
        np.savez(tmp, keys=K, meta=json.dumps(out))
        tmp.replace(dst)
        print(f"{b}: layer {deep} {args.deep} + layer {mid} {args.mid} -> {dst}", flush=True)
    return 0


def main(argv=None) -> int:
    ap, sub, _, _ = probe_parser(__doc__, "pooling", threads=0)
    c = sub.add_parser("memsim-cache", help="one pairing as a bench/keys.py cache, for bench/memsim.py")
    c.add_argument("--cache", type=Path, default=Path("bench-results/pooling"))
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--deep", choices=sorted(POOLINGS), required=True, help="pooling of the deeper key layer")
    c.add_argument("--mid", choices=sorted(POOLINGS), required=True, help="pooling of the middle key layer")
    c.add_argument("--benchmarks", default=",".join(BENCHES))
    c.add_argument("--model", default=None, help="the model the cache was extracted with (its depth)")
    add_split_arguments(c)
    args = ap.parse_args(argv)
    return {"extract": extract, "eval": evaluate, "memsim-cache": memsim_cache}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
