"""How many raises a hold needs (``runtime.engine.MAX_RAISES``): a dev run with the cap lifted.

The hold (docs/method.md §6.5) decodes a steered step again with a larger push until the memory's
token leads, at most ``MAX_RAISES`` (4) times, then keeps the model's token. Whether 4 binds is a
count: this runs ``miita-edge bench`` in this process with the cap set to ``--cap`` (default 16)
and every held step's raises recorded, then prints how many steps resolved after r raises, how many
never did within the cap, and how many needed more than 4 (the steps the shipped cap changes).

    python bench/raises.py [--cap 16] -- --benchmark banking77-replies --split dev --budget 5% ...

Everything after ``--`` goes to ``miita-edge bench`` as it is (give it ``--split dev``).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def histogram_lines(counts: Counter, gave_up: int, cap: int, shipped: int) -> list[str]:
    """counts[r]: held steps whose memory token led after r raises (r = 0: the hold let the token stand)."""
    total = sum(counts.values()) + gave_up
    lines = [f"held steps: {total}"]
    for r in sorted(counts):
        lines.append(f"  led after {r:2d} raise(s): {counts[r]:6d}")
    lines.append(f"  never led within {cap}: {gave_up:6d}")
    beyond = sum(n for r, n in counts.items() if r > shipped)
    lines.append(f"steps the shipped cap ({shipped}) changes: {beyond} of {total} led only after more raises; "
                 f"{gave_up} did not lead even after {cap}")
    return lines


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mine, bench = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=int, default=16, help="raises allowed in this run (the shipped cap is 4)")
    args = ap.parse_args(mine)
    if "--split" not in bench or bench[bench.index("--split") + 1] != "dev":
        ap.error("give miita-edge bench --split dev after --: this probe chooses a constant")
    sys.path.insert(0, str(ROOT / "python"))
    import miita_edge.runtime.engine as engine_mod
    from miita_edge.cli import main as cli_main

    shipped, counts, gave_up = engine_mod.MAX_RAISES, Counter(), [0]
    engine_mod.MAX_RAISES = args.cap
    original = engine_mod.Engine.hold_step

    def counting(self, hold, step, generated, state, d, eta, mode, tok, logits, *rest):
        calls = [0]

        def counted(*a):
            calls[0] += 1
            return hold(*a)
        out = original(self, counted, step, generated, state, d, eta, mode, tok, logits, *rest)
        # hold_step asks the hold once per pass (r + 1 times when it ends after r raises); it gives
        # up only after cap + 1 passes, and then returns the step's first logits unchanged
        if calls[0] == args.cap + 1 and out[1] is logits:
            gave_up[0] += 1
        else:
            counts[calls[0] - 1] += 1
        return out

    engine_mod.Engine.hold_step = counting
    rc = cli_main(["bench", *bench])
    print(f"# command: python bench/raises.py {' '.join(argv)}")
    print("\n".join(histogram_lines(counts, gave_up[0], args.cap, shipped)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
