"""Which splits of a key-only pass keep its key bitwise (the rules of ``runtime.key_prefix``).

Decodes prompts of n = 5..39 and 60..138 tokens (a SuperNI prompt cut short) whole, and again as
two decodes, rows [0, p) then [p, n), for every p in 1..n-1, and compares the pooled keys (version 4:
layer 12 at the last row, layer 9 mean) bit for bit. Splits are grouped by the rules' conditions
(p a multiple of 4; both parts >= 8 rows; both parts on the whole pass's flash-attention path, the
tiled one from 64 rows) and each group prints how many splits were bitwise.

    python bench/key_prefix_rules.py [--data ../shared/data/superni/train.jsonl] [--step 1]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/superni/train.jsonl")
    ap.add_argument("--step", type=int, default=1, help="every step-th cut p (1: all)")
    args = ap.parse_args(argv)

    from miita_edge.runtime.engine import Engine, EngineConfig

    e = Engine(None, EngineConfig(n_threads=2, key_prefix_cache=False))
    e.set_key_layers((12, 9), ("last", "mean"))
    with open(args.data, encoding="utf-8") as f:
        base = e.tokenize(json.loads(f.readline())["input"], add_bos=True)
    if len(base) < 139:
        raise SystemExit(f"{args.data}: first prompt has {len(base)} tokens, need 139")

    def split(toks, mask, p):
        e.reset()
        e.native.set_stop_after_keys(True)
        try:
            e.decode(toks[:p], "none", key_mask=mask[:p])
            e.decode(toks[p:], "none", key_mask=mask[p:])
            return e.key_sum()
        finally:
            e.native.set_stop_after_keys(False)
            e.reset()

    groups: dict[tuple, list[int]] = {}
    for n in list(range(5, 40)) + list(range(60, 139, 3)):
        toks = base[:n]
        mask = e.key_mask(toks, True)
        whole = e.prompt_key(toks, mask)
        for p in range(1, n, args.step):
            s = split(toks, mask, p)
            same = np.array_equal(whole[0], s[0]) and np.array_equal(whole[1], s[1])
            side = (p >= 64) == (n >= 64) and (n - p >= 64) == (n >= 64)
            g = (p % 4 == 0, min(p, n - p) >= 8, side)
            groups.setdefault(g, [0, 0])
            groups[g][0] += same
            groups[g][1] += 1
    print("# bench/key_prefix_rules.py  splits [0,p)+[p,n) of one prompt, n = 5..39 and 60..138; keys bitwise?")
    print("   p % 4 == 0   both >= 8 rows   same attention path   bitwise / splits")
    for (a, b, c), (k, t) in sorted(groups.items(), reverse=True):
        print(f"   {str(a):11s}  {str(b):15s}  {str(c):20s}  {k:5d} / {t}")
    e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
