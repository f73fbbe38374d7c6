"""Are 20 paraphrase groups enough to choose a model's key layers? Random halves of the set.

The default measures its two key layers on ``key_layers.PARAPHRASES`` (20 everyday requests, three
phrasings each; docs/method.md, "Which layers"): the pair whose combined sign key finds a phrasing's
sibling as its nearest neighbour most often. How many groups that needs is a constant of its own.
This draws ``--halves`` random halves of the groups (10 of 20), lets each half choose its pair by the
same rule (``key_layers.pair_scores`` and the same tie-breaks), and scores every chosen pair on the
*other* half, beside the pair the whole set chose. If halves choose pairs that do as well on the
groups they did not see as the whole set's pair does, the whole set is more than the rule needs.
Then the whole set's pair is scored on ``key_whitening.MORE_PARAPHRASES`` (40 more everyday
requests, four phrasings each, which the criterion never reads), beside the best pair on them.

    python bench/key_layers.py [--model GGUF] [--template plain] [--halves 20] [--threads 2] [--designs]

``--designs`` then asks the same criterion about the two choices around the layers that were first
made on benchmark test rows (docs/method.md §2.2-2.3): how each layer is pooled (last row or mean,
four pairings) and whether the mean keeps the BOS row. Each design picks its best pair on the 20
groups and is scored there and on the 40 groups it never reads.

No benchmark row is read: the groups are the criterion's own.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def best_pair(acc: np.ndarray, margin: np.ndarray) -> tuple[int, int]:
    """The index pair ``key_layers.measure`` picks: best accuracy, wider margin, shallower layers."""
    L = acc.shape[0]
    order = sorted(((acc[a, b], margin[a, b], -max(a, b), -a, a, b) for a in range(L) for b in range(L)
                    if a != b), reverse=True)
    return order[0][4], order[0][5]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--template", default="plain")
    ap.add_argument("--halves", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--designs", action="store_true", help="also score poolings and the BOS row (see above)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.method import key_layers as kl
    from miita_edge.method.key_whitening import MORE_PARAPHRASES
    from miita_edge.method.calibration import CALIBRATION_INPUTS
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig

    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    template = get_template(args.template)
    layers = list(range(1, engine.n_layer - 1))
    texts = [t for g in kl.PARAPHRASES for t in g]
    groups = np.array([i for i, g in enumerate(kl.PARAPHRASES) for _ in g])
    centred = {}
    for pooling in ("last", "mean"):
        k = kl._keys(engine, template, texts, layers, pooling)
        c = kl._keys(engine, template, list(CALIBRATION_INPUTS), layers, pooling).mean(axis=0)
        centred[pooling] = k - c
        more = [t for g in MORE_PARAPHRASES for t in g]
        centred["more-" + pooling] = kl._keys(engine, template, more, layers, pooling) - c
    if args.designs:  # the mean over every prompt row, BOS included
        c = kl._keys(engine, template, list(CALIBRATION_INPUTS), layers, "mean", skip_bos=False).mean(axis=0)
        centred["bos"] = kl._keys(engine, template, texts, layers, "mean", skip_bos=False) - c
        centred["more-bos"] = kl._keys(engine, template, more, layers, "mean", skip_bos=False) - c
    engine.close()
    more_groups = np.array([i for i, g in enumerate(MORE_PARAPHRASES) for _ in g])

    def scores(sel_groups):
        rows = np.isin(groups, sel_groups)
        return kl.pair_scores(centred["last"][rows], centred["mean"][rows], groups[rows])

    n = len(kl.PARAPHRASES)
    acc, margin = scores(np.arange(n))
    a0, b0 = best_pair(acc, margin)
    print(f"# model {Path(args.model).name if args.model else 'embedded Gemma-3-270M'}, template {args.template}, "
          f"{n} groups, layers 1..{engine.n_layer - 2}")
    print(f"whole set: last-row layer {layers[a0]}, averaged layer {layers[b0]}: nearest sibling {100 * acc[a0, b0]:.1f}%")
    rng = np.random.default_rng(args.seed)
    picks, gaps = Counter(), []
    if args.halves:
        print("| half | its pair | on the other half: its pair | the whole set's pair |")
        print("|---|---|---|---|")
    for h in range(args.halves):
        half = np.sort(rng.permutation(n)[: n // 2])
        other = np.setdiff1d(np.arange(n), half)
        a, b = best_pair(*scores(half))
        acc_o, _ = scores(other)
        picks[(layers[a], layers[b])] += 1
        gaps.append(acc_o[a, b] - acc_o[a0, b0])
        print(f"| {h + 1} | {layers[a]} + {layers[b]} | {100 * acc_o[a, b]:.1f}% | {100 * acc_o[a0, b0]:.1f}% |")
    same = picks.get((layers[a0], layers[b0]), 0)
    gaps = 100 * np.asarray(gaps) if gaps else np.zeros(1)
    print(f"halves choosing the whole set's pair: {same} of {args.halves}; pairs chosen: "
          + ", ".join(f"{a}+{b} x{c}" for (a, b), c in picks.most_common()))
    print(f"a half's pair minus the whole set's pair, on the half it did not see: mean {gaps.mean():+.1f} points, "
          f"range [{gaps.min():+.1f}, {gaps.max():+.1f}]")
    acc_m, margin_m = kl.pair_scores(centred["more-last"], centred["more-mean"], more_groups)
    am, bm = best_pair(acc_m, margin_m)
    flat = np.sort(acc_m[np.isfinite(acc_m)])[::-1]
    rank = int(np.sum(flat > acc_m[a0, b0])) + 1
    print(f"on the {len(MORE_PARAPHRASES)} groups the criterion never reads: the whole set's pair "
          f"{layers[a0]} + {layers[b0]} {100 * acc_m[a0, b0]:.1f}% (rank {rank} of {flat.size} pairs); "
          f"their own best pair {layers[am]} + {layers[bm]} {100 * acc_m[am, bm]:.1f}%")
    if args.designs:
        print("\n| design (first layer, second layer) | criterion's pair | on the 20 groups | on the 40 other groups |")
        print("|---|---|---|---|")
        for first, second in (("last", "mean"), ("mean", "mean"), ("last", "last"), ("mean", "last"),
                              ("last", "bos"), ("bos", "bos")):
            c = kl.best_choice(centred, groups, layers, [(first, second)])  # the product's chooser
            a, b = layers.index(c.last), layers.index(c.mean)
            acc_m, _ = kl.pair_scores(centred["more-" + first], centred["more-" + second], more_groups)
            name = {"bos": "mean with BOS"}
            print(f"| {name.get(first, first)}, {name.get(second, second)} | {c.last} + {c.mean} | "
                  f"{100 * c.accuracy:.1f}% | {100 * acc_m[a, b]:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
