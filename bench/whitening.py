"""Does whitening keys against paraphrase noise find a query's intent more often, and at which
shrinkage? The measurement behind ``method/key_whitening.SHRINK`` (docs/method.md §17).

    python bench/whitening.py [--model GGUF] [--data ../shared/data/banking77] [--split dev]
                              [--folds 5] [--k 8] [--out bench-results/whitening-gemma.json]

Rows: Banking77's dev rows of every stage (``splits``: a hashed 10% of each stage's training rows,
never learned by a reported run); ``--split test`` is refused without ``--report-on-test``. Each row's
key is computed as a default memory computes it (its key layers, pooling, template and centring);
the whitening is measured on the model over ``key_whitening.GROUPS``, which no benchmark wrote.
Score: the rows split into ``--folds`` folds; each fold's rows vote among the other folds' rows, the
majority intent of the ``--k`` nearest sign-bit keys (the default's anchor vote without its
temperature and centroids: a retrieval-only figure, no generation). The rule, fixed before the
run: the shrinkage with the best mean accuracy over the models run; ties go to the larger one
(closer to the identity).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

SHRINKS = (0.1, 0.3, 0.6)


def sign_knn_accuracy(keys: np.ndarray, labels: np.ndarray, folds: int, k: int, seed: int = 0) -> float:
    """Share of rows whose ``k`` nearest other-fold keys (sign bits, Hamming) vote their label."""
    bits = np.where(keys >= 0, 1.0, -1.0)
    part = np.array_split(np.random.default_rng(seed).permutation(len(labels)), folds)
    right = 0
    for f in range(folds):
        te = part[f]
        tr = np.concatenate([part[g] for g in range(folds) if g != f])
        S = bits[te] @ bits[tr].T
        near = np.argsort(-S, axis=1, kind="stable")[:, :k]
        for i, row in enumerate(near):
            votes = np.bincount(labels[tr][row], minlength=labels.max() + 1)
            right += int(votes.argmax() == labels[te[i]])
    return right / len(labels)


def measure(model: str | None, data: Path, split: str, folds: int, k: int) -> dict:
    from miita_edge import Miita
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.method import key_whitening as kw
    from miita_edge.method.calibration import raw_key

    spec = get_benchmark("banking77")
    _, stages = load_benchmark(spec, data, split=split)
    rows = [it.example for s in stages for it in s.test]
    names = sorted({e.output for e in rows})
    labels = np.array([names.index(e.output) for e in rows])
    with tempfile.TemporaryDirectory() as tmp, Miita(model, Path(tmp) / "mem", template=spec.template) as m:
        eng = m.keyed_engine()
        raw = np.stack([raw_key(eng, m.template, e.input, m.preset.skip_bos) for e in rows])
        para = kw.paraphrase_keys(eng, m.template, m.preset.skip_bos, m.fingerprint())
        mean, parts = m.bank.key_mean, len(m.key_layers)
        name = Path(m.engine.info.path).name
    z = kw.prepared(raw, mean, parts)
    zp = kw.prepared(para, mean, parts)
    W = kw.within_scatter(zp, kw.group_ids())
    out = {"model": name, "rows": len(rows), "intents": len(names), "split": split, "folds": folds, "k": k,
           "accuracy": {"none": sign_knn_accuracy(z, labels, folds, k)}}
    for s in SHRINKS:
        out["accuracy"][str(s)] = sign_knn_accuracy(z @ kw.whitening_matrix(W, s), labels, folds, k)
    return out


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from miita_edge.evaluation.splits import add_split_arguments, exit_unless_tuning_split

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=None, help="GGUF path; repeatable (default: the embedded Gemma-3-270M)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    add_split_arguments(ap)
    args = ap.parse_args(argv)
    exit_unless_tuning_split(args, "bench/whitening.py")
    results = [measure(mo, args.data, args.split, args.folds, args.k) for mo in (args.model or [None])]
    for r in results:
        acc = "  ".join(f"{s}: {100 * a:.1f}%" for s, a in r["accuracy"].items())
        print(f"{r['model']:36s} {r['rows']} {r['split']} rows, {r['intents']} intents  shrink {acc}")
    mean = {s: float(np.mean([r["accuracy"][str(s)] for r in results])) for s in SHRINKS}
    best = max(SHRINKS, key=lambda s: (round(mean[s], 6), s))
    print(f"chosen shrinkage {best} (mean {100 * mean[best]:.1f}% over {len(results)} model(s); "
          f"unwhitened {100 * np.mean([r['accuracy']['none'] for r in results]):.1f}%)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": results, "mean": mean, "chosen": best}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
