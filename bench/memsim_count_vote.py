"""Experiment (forgetting): weight each anchor's vote by how many examples it stands for.

A folded anchor (repair's prune step) stands for ``anchor_count`` examples; the shipped vote gives it
one softmax weight like a single example. This replays ``bench/memsim.py --preset default-v3`` (the
default when it was measured; ``--preset default`` with a matching ``--cache`` for today's) with the
vote's weight of every voter row multiplied by f(count) (anchors) and f(c) for the centroid rows
(c = 1, or the mean count of the answer's anchors), to see whether kNN-over-examples semantics
forget less. It patches ``plan.knn_prototypes`` and ``RetrievalIndex.build`` in this process only.

    python bench/memsim_count_vote.py --weight count --centroid mean --benchmarks banking77,dsc --budgets 5%,20%

Result (docs/method.md, "Tried and not adopted"): Banking77 at 20% gains, DSC at 20% loses 7–12
points; not adopted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memsim  # noqa: E402
from miita_edge.evaluation.splits import add_split_arguments  # noqa: E402
from miita_edge.method import plan as P  # noqa: E402
from miita_edge.method import steering as S  # noqa: E402

WEIGHTS = {"none": np.ones_like, "count": lambda x: x, "sqrt": np.sqrt, "log": lambda x: 1 + np.log(x)}


def patch(weight: str, centroid: str, per_answer: bool = False) -> None:
    state: dict = {}
    f = WEIGHTS[weight]
    build0 = P.RetrievalIndex.build.__func__

    def build(cls, bank, entries=None, centroids=False):
        idx = build0(cls, bank, entries, centroids)
        if idx.voters is not None:
            c = np.asarray(bank.anchor_counts(), np.float64).reshape(-1)
            J, own = len(bank.protos), idx.voter_owner[:len(c)]
            total, n = np.bincount(own, weights=c, minlength=J), np.bincount(own, minlength=J)
            cm = np.ones(J) if centroid == "one" else total / np.maximum(n, 1)
            mult = np.concatenate([f(c), f(cm)]) if len(idx.voters) > len(c) else f(c)
            if per_answer:
                mult = mult / f(np.maximum(total, 1))[idx.voter_owner]
            state["mult"] = mult
        return idx

    knn0 = S.knn_prototypes

    def knn(k_q, anchors, owner, k, T, unit_anchors=False, scores=None):
        s = None if scores is None else np.asarray(scores, np.float64)
        mult = state.get("mult")
        if s is None or len(s) == 0 or k <= 0 or mult is None or len(mult) != len(s):
            return knn0(k_q, anchors, owner, k, T, unit_anchors, scores)
        order = np.lexsort((np.arange(len(s)), -s))[:k]  # the shipped tie rule
        z = s[order] / T
        w = np.exp(z - z.max()) * mult[order]
        w /= w.sum()
        owners = np.asarray(owner)[order]
        ids = np.unique(owners)
        weight = np.array([w[owners == j].sum() for j in ids])
        best = np.array([s[order][owners == j].max() for j in ids])
        rank = np.lexsort((ids, -weight))
        return ids[rank].astype(np.int64), weight[rank], best[rank]

    P.RetrievalIndex.build = classmethod(build)
    P.knn_prototypes = knn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weight", choices=sorted(WEIGHTS), default="count")
    ap.add_argument("--centroid", choices=("one", "mean"), default="one")
    ap.add_argument("--per-answer", action="store_true", help="divide each row's weight by its answer's total "
                    "count (a vote balanced across answers instead of across examples)")
    ap.add_argument("--cache", type=Path, default=Path("bench-results/keys"))
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--benchmarks", default="banking77,dsc,xquad,superni")
    ap.add_argument("--budgets", default="1%,5%,20%,none")
    ap.add_argument("--framing", type=int, default=250)
    ap.add_argument("--preset", default="default-v3", help="as bench/memsim.py --preset")
    add_split_arguments(ap)
    args = ap.parse_args(argv)
    memsim.guard(args, "bench/memsim_count_vote.py")
    patch(args.weight, args.centroid, args.per_answer)
    ns = argparse.Namespace(cache=args.cache, data=args.data, framing=args.framing, preset=args.preset, set=[],
                            centroids_only=False, split=args.split)
    for bench in args.benchmarks.split(","):
        for budget in args.budgets.split(","):
            r = memsim.run_preset(ns, bench, budget)
            print(f"{args.weight:5s}{'/answer' if args.per_answer else ''} centroid {args.centroid:4s} {bench:9s} {budget:>4s}  OP {r['op']:6.2f}  BWT {r['bwt']:6.2f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
