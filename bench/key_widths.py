"""How wide each stored key is after every stage of a benchmark run: the bits each anchor stores itself, plus
the bits kept once for every key (``key_shared``), read from the run's per-stage snapshots
(``OUT/state/stage-NN``).

Why: repair narrows keys only as far as a preset's floor (``BankConfig.min_key_bits``), and keys only ever
narrow. A run whose keys store more bits than a floor at its last stage never reached that floor. Another
floor at or below its width would then have built the same memory, stage by stage. This is how a change of
floor is known to leave a cell alone without running it (docs/results/candidates/narrow-floor-64.md).

    python bench/key_widths.py RUN_DIR [RUN_DIR ...] [--floor 96]

With ``--floor F`` it also says, per run, whether the floor was reached (some stage stores F bits or fewer).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path



def stage_widths(run: Path) -> list[tuple[int, int]]:
    """(stored bits, shared bits) of each stage's snapshot under ``run/state``, in stage order."""
    from miita_edge.memory.store import Store

    out = []
    for st in sorted(p for p in (run / "state").glob("stage-*") if p.is_dir()):
        arrays = Store(st).read().arrays
        shared = len(arrays["key_shared"]) if "key_shared" in arrays else 0
        out.append((8 * int(arrays["anchors"].shape[1]), shared))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="benchmark output directories (each with state/)")
    ap.add_argument("--floor", type=int, default=None, help="say whether any stage's keys reached this many bits")
    args = ap.parse_args(argv)
    bad = 0
    for run in args.runs:
        if not (run / "state").is_dir():
            print(f"{run}: no state/ directory (no stage was learned: a budget that holds nothing, or not a benchmark run, or its snapshots were removed)", file=sys.stderr)
            bad += 1
            continue
        w = stage_widths(run)
        line = f"{run}: " + " ".join(f"{s}+{sh}" for s, sh in w)
        if args.floor is not None and w:
            line += f"  | floor {args.floor} " + ("reached" if min(s for s, _ in w) <= args.floor else "never reached")
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
