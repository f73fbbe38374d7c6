"""How the inverted file's k-means is built: sample rows per list and Lloyd rounds against recall.

``method/ivf_index.py`` builds its lists by Hamming k-means over ``SAMPLE_PER_LIST`` sampled rows per
list for ``ROUNDS`` rounds. Both only shape the lists (the candidates are re-scored exactly), so
what they can cost is recall (a true top row outside the probed lists) and build time. This builds
the index over one synthetic memory for each (sample, rounds) pair, with everything else as shipped,
and prints the recall of the exact top-k rows among the proposed candidates and the build time.

Rows: ``--centres`` random sign vectors (``--rank R``: the signs of a rank-R product, so centres
share directions as real keys do) of the default key width (Gemma: 1,280 bits), each row a
centre with every bit flipped with probability ``--flip`` (the clustered rows of ``bench/ann.py``
are real Banking77 keys flipped so; random centres need no model). Queries: a centre's signs times
|N(0, 1)| magnitudes (a float query, as the vote's), with the same flip rate.

    python bench/ivf_build.py [--rows 100000] [--queries 200] [--k 16] [--samples 8,16,32,64] [--rounds 1,3,6]

No benchmark row is read; the choice it informs changes speed and recall, not which answer a
complete scan would vote for.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--bits", type=int, default=1280)
    ap.add_argument("--centres", type=int, default=0, help="default: one per 33 rows (3,075 Banking77 "
                    "keys as centres of 100,000 rows, as bench/ann.py's clustered memory)")
    ap.add_argument("--flip", type=float, default=0.2)
    ap.add_argument("--rank", type=int, default=0, help="centres as the signs of a rank-R Gaussian product "
                    "(correlated, as real keys are); 0: independent random signs")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--samples", default="8,16,32,64")
    ap.add_argument("--rounds", default="1,3,6")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.method import ivf_index
    from miita_edge.native import ext

    args.centres = args.centres or max(1, args.rows // 33)
    rng = np.random.default_rng(args.seed)
    if args.rank:
        centres = rng.standard_normal((args.centres, args.rank)) @ rng.standard_normal((args.rank, args.bits)) > 0
    else:
        centres = rng.random((args.centres, args.bits)) < 0.5
    owner = rng.integers(0, args.centres, args.rows)
    bits = centres[owner] ^ (rng.random((args.rows, args.bits)) < args.flip)
    rows = np.packbits(bits, axis=1)
    qc = rng.integers(0, args.centres, args.queries)
    qbits = centres[qc] ^ (rng.random((args.queries, args.bits)) < args.flip)
    Q = (np.where(qbits, 1.0, -1.0) * np.abs(rng.standard_normal(qbits.shape))).astype(np.float32)
    truth = [set(np.argsort(-ext.bit_scores(rows, q).astype(np.float64), kind="stable")[:args.k].tolist()) for q in Q]
    kind = f"rank-{args.rank} centres" if args.rank else "random centres"
    print(f"# {args.rows:,} rows of {args.bits} bits around {args.centres:,} {kind}, flip {args.flip}; "
          f"{args.queries} queries; recall of the exact top {args.k} among the proposed candidates; "
          f"shipped: sample {ivf_index.SAMPLE_PER_LIST} per list, {ivf_index.ROUNDS} rounds")
    print("| sample per list | rounds | build s | recall |")
    print("|---|---|---|---|")
    saved = ivf_index.SAMPLE_PER_LIST, ivf_index.ROUNDS
    try:
        for s in (int(v) for v in args.samples.split(",")):
            for r in (int(v) for v in args.rounds.split(",")):
                ivf_index.SAMPLE_PER_LIST, ivf_index.ROUNDS = s, r
                t = time.perf_counter()
                index = ivf_index.IvfIndex.build(rows)
                build = time.perf_counter() - t
                hits = sum(len(truth[i] & set(index.propose(q, args.k).tolist())) for i, q in enumerate(Q))
                mark = " (shipped)" if (s, r) == saved else ""
                print(f"| {s}{mark} | {r} | {build:.1f} | {hits / (args.k * len(Q)):.4f} |", flush=True)
    finally:
        ivf_index.SAMPLE_PER_LIST, ivf_index.ROUNDS = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
