"""The difference in OP between two runs scored on the same test rows, with a paired bootstrap
interval: is a gap between two presets larger than the subsample can tell?

Why paired: two bench results over the same final row score the very same queries, so the noise of
which queries were drawn cancels in the per-query difference; two independent intervals (RESULTS)
overlap far more than the paired one. Reads ``final_row_scores`` of each result.json.

    python bench/paired_diff.py A/result.json B/result.json [--boot 10000]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def final_row(path: Path) -> tuple[dict, np.ndarray]:
    r = json.loads(path.read_text("utf-8"))
    if "final_row_scores" not in r:
        raise SystemExit(f"{path}: no final_row_scores (a result from before per-query scores were kept)")
    return r, np.concatenate([np.asarray(s, float).reshape(-1) for s in r["final_row_scores"]])


def paired_interval(a: np.ndarray, b: np.ndarray, boot: int, seed: int = 0) -> tuple[float, float, float]:
    """(mean of b - a, 2.5th and 97.5th percentile of its bootstrap over queries), in points."""
    d = (b - a) * 100.0
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, (boot, d.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--boot", type=int, default=10_000)
    args = ap.parse_args(argv)
    ra, a = final_row(args.a)
    rb, b = final_row(args.b)
    if a.size != b.size or ra.get("benchmark") != rb.get("benchmark") or \
            ra.get("limit_per_stage") != rb.get("limit_per_stage"):
        raise SystemExit("the two results do not score the same test rows (benchmark, limit_per_stage, count)")
    mean, lo, hi = paired_interval(a, b, args.boot)
    for name, r, s in (("A", ra, a), ("B", rb, b)):
        ci = r.get("op_ci95") or [float("nan")] * 2
        print(f"{name}: {r.get('method')} {r.get('budget_spec')}  OP {r['op']:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]  "
              f"({s.size} queries; {args.a if name == 'A' else args.b})")
    print(f"B - A: {mean:+.1f} points, paired bootstrap 95% interval [{lo:+.1f}, {hi:+.1f}]; "
          f"right only in A {int(((a > b)).sum())}, only in B {int(((b > a)).sum())} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
