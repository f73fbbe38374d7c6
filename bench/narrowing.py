"""At a tight budget, narrow every key before evicting answers, or evict answers and keep wide keys?

Why: the default preset's repair narrows all 1-bit keys (8 coordinates at a time, down to
``MIN_KEY_BITS``) before it merges or evicts a prototype (docs/method.md, "Repair under a byte
budget"), because an evicted answer is lost for good while a narrowed key still retrieves it. Long
replies make the question sharper: at 1% the canned-reply memory keeps whole replies for 50 of the
77 intents with keys narrowed to 32 bits, and retrieves the right intent for few queries
(docs/method.md, "Repair under a byte budget", has this script's result). This script runs both
policies through the real harness (stages in order, byte budget resolved once, the real bank, repair
and relevance gate) on each benchmark's **dev rows**, with the preset's own generation:

- ``narrow``: the default preset as shipped;
- ``evict``: the same preset with ``shrink_keys`` off, so repair prunes anchors, merges and then
  evicts whole prototypes, and every kept key keeps its full width.

    python bench/narrowing.py --data ../shared/data --benchmarks banking77,banking77-replies --budgets 1%

**Decision rule (fixed before the first run):** over every (benchmark, budget) cell run, the policy
with the higher mean OP; the shipped policy (``narrow``) stays unless ``evict`` beats it by more than
``--margin`` points (default 0.5). ``--split test`` is refused without ``--report-on-test``: this
script chooses a setting.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keys import guard  # noqa: E402

POLICIES = ("narrow", "evict")


def preset_for(policy: str):
    """The default preset with the repair policy ``policy``."""
    from miita_edge.method.presets import default_preset

    p = default_preset()
    if policy == "evict":
        p.bank.shrink_keys = False
    elif policy != "narrow":
        raise ValueError(f"unknown policy {policy!r}")
    p.bank.validate()
    return p


def data_dir(root: Path, bench: str) -> Path:
    from miita_edge.evaluation.benchmarks import get_benchmark

    return root / get_benchmark(bench).data_name


def run_one(args, bench: str, budget: str, policy: str) -> dict:
    from miita_edge.evaluation import registry
    from miita_edge.evaluation.methods import MiitaMethod
    from miita_edge.evaluation.runner import run_benchmark

    name = f"miita-default-{policy}"
    registry.register_method(name, lambda: MiitaMethod(lambda: preset_for(policy)),
                             f"bench/narrowing.py: default preset, repair policy {policy}")
    out = args.out / bench / budget.replace("%", "") / policy
    res = run_benchmark(bench, data_dir(args.data, bench), name, out, budget=budget, progress=False, baseline=None,
                        model=args.model, threads=args.threads, cells="summary", split=args.split,
                        extract_cache_dir=args.extract_cache, limit_train_per_stage=None)
    return {"benchmark": bench, "budget": budget, "policy": policy, "split": args.split, "model": res["model"],
            "op": res["op"], "bwt": res["bwt"], "memory_bytes": res["memory_bytes"],
            "rows": sum(p["n_test"] for p in res["per_stage"])}


def decide(rows: list[dict], margin: float) -> tuple[str, dict[str, float]]:
    """The rule of the module docstring over the (benchmark, budget) cells both policies ran:
    (chosen policy, mean OP per policy)."""
    cells = {}
    for r in rows:
        cells.setdefault((r.get("model"), r["benchmark"], r["budget"]), {})[r["policy"]] = r["op"]
    both = [c for c in cells.values() if all(p in c for p in POLICIES)]
    if not both:
        raise SystemExit("no cell has runs of both policies")
    mean = {p: sum(c[p] for c in both) / len(both) for p in POLICIES}
    return ("evict" if mean["evict"] > mean["narrow"] + margin else "narrow"), mean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--benchmarks", default="banking77,banking77-replies")
    ap.add_argument("--budgets", default="1%")
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled Gemma-3-270M)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--extract-cache", type=Path, default=None, help="the harness's extract cache (speeds learning)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/narrowing"))
    ap.add_argument("--margin", type=float, default=0.5)
    ap.add_argument("--decide", nargs="*", type=Path, default=None,
                    help="no runs: apply the decision rule to these runs.jsonl files")
    from miita_edge.evaluation.splits import add_split_arguments

    add_split_arguments(ap)
    args = ap.parse_args(argv)
    guard(args, "bench/narrowing.py")
    if args.decide is not None:
        rows = [json.loads(line) for f in args.decide for line in f.read_text().splitlines() if line.strip()]
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = []
        for b in args.benchmarks.split(","):
            for budget in args.budgets.split(","):
                for policy in POLICIES:
                    r = run_one(args, b, budget, policy)
                    rows.append(r)
                    with open(args.out / "runs.jsonl", "a") as f:
                        f.write(json.dumps(r) + "\n")
                    print(f"{b} {budget} {policy} ({r['rows']} {r['split']} rows): OP {r['op']:.1f}, "
                          f"BWT {r['bwt']:.1f}, {r['memory_bytes']:,} bytes", flush=True)
    chosen, mean = decide(rows, args.margin)
    print("mean OP:", "  ".join(f"{p} {v:.2f}" for p, v in mean.items()), f"-> {chosen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
