"""Does the hold bring more taught replies back whole? A probe on Banking77's training rows only.

The hold (``Preset.hold_min_tokens``, method/steering.hold_target and lead_push): while a reply of
16 tokens or more leads the steering, a produced token that none of the steering answers has at that
position is replaced by the leading answer's, the step decoded again with an addition that puts it
one logit above the token that won. This probe teaches a dozen intents' canned replies (the draw of
``bench/intents.py``: 12 intents, the first 10 training rows of each taught, the next 20 asked; no
test row) and asks every held-out row with the preset as it is (hold off) and with the hold on.

Greedy decoding makes the two answers identical wherever the hold raised nothing (it only changes a
step it raises, and decoding a step again leaves the KV cache as it was), so the hold-off answer
is decoded only for rows where the hold raised a step (``--both`` decodes it for every row).

    python bench/hold.py probe --data ../shared/data/banking77 --seed 20 [--model GGUF] --tag=-gemma
    python bench/hold.py choose docs/results/v11/hold/hold-*.json    # the rule in rule.txt there
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from intents import draw  # noqa: E402  (the draw every probe of intents shares)

MIN_TOKENS = 16


def probe(args) -> Path:
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    taught, asked, answer = draw(args.data, args.seed, args.intents, args.taught, args.asked, False)
    args.out.mkdir(parents=True, exist_ok=True)
    mem = args.out / f"mem-hold-{args.seed}{args.tag}"
    shutil.rmtree(mem, ignore_errors=True)
    m = Miita(model=args.model, memory=mem, template="plain")
    m.ingest([Example(x, y) for x, y in taught], budget=None, progress=False)
    preset = f"{m.preset.name}/{m.preset.version}"
    rows, t0 = [], time.time()
    for i, (x, lab) in enumerate(asked):
        m.preset.hold_min_tokens = MIN_TOKENS
        on = m.ask(x, max_tokens=args.max_tokens)
        m.preset.hold_min_tokens = 0
        off = m.ask(x, max_tokens=args.max_tokens) if (on.raised or args.both) else on
        gold = answer[lab].strip()
        rows.append({"input": x, "gold": lab, "on": on.text, "off": off.text, "raised": on.raised,
                     "right_on": on.text.strip() == gold, "right_off": off.text.strip() == gold})
        if args.both and not on.raised and on.text != off.text:
            raise SystemExit(f"row {i}: the hold raised nothing and changed the answer; the shortcut is wrong")
        if (i + 1) % 20 == 0:
            print(f"{i + 1}/{len(asked)} asked, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    m.close()
    shutil.rmtree(mem, ignore_errors=True)
    n = len(rows)
    res = {"seed": args.seed, "model": Path(args.model).name if args.model else "default", "preset": preset,
           "intents": args.intents, "taught": args.taught, "asked": args.asked, "min_tokens": MIN_TOKENS,
           "share_off": 100.0 * sum(r["right_off"] for r in rows) / n,
           "share_on": 100.0 * sum(r["right_on"] for r in rows) / n,
           "rows_raised": sum(bool(r["raised"]) for r in rows), "rows": rows}
    path = args.out / f"hold-{args.seed}{args.tag}.json"
    path.write_text(json.dumps(res, indent=1), "utf-8")
    print(f"{path}: whole replies {res['share_off']:.1f}% without the hold, {res['share_on']:.1f}% with it "
          f"({res['rows_raised']} of {n} rows raised)")
    return path


def choose(files: list[Path]) -> bool:
    """The rule written before the probes (docs/results/v11/hold/rule.txt): adopt when the mean over
    the files gains more than 0.5 points and neither model's mean loses more than 1."""
    data = [json.loads(f.read_text("utf-8")) for f in files]
    print("| file | asked | rows raised | hold off | hold on |\n|---|---:|---:|---:|---:|")
    by_model: dict[str, list[tuple[float, float]]] = {}
    for f, d in zip(files, data):
        print(f"| {f.name} | {len(d['rows'])} | {d['rows_raised']} | {d['share_off']:.1f} | {d['share_on']:.1f} |")
        by_model.setdefault(d["model"], []).append((d["share_off"], d["share_on"]))
    off = sum(d["share_off"] for d in data) / len(data)
    on = sum(d["share_on"] for d in data) / len(data)
    print(f"| mean | | | {off:.2f} | {on:.2f} |")
    worst = min(sum(b - a for a, b in v) / len(v) for v in by_model.values())
    for name, v in by_model.items():
        print(f"{name}: off {sum(a for a, _ in v) / len(v):.2f}, on {sum(b for _, b in v) / len(v):.2f}")
    adopt = on - off > 0.5 and worst >= -1.0
    print(f"rule: mean gain {on - off:+.2f}, worst model {worst:+.2f}: "
          f"{'adopt the hold' if adopt else 'keep the hold off'}")
    return adopt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="teach a dozen intents' replies, ask held-out training rows, hold off and on")
    p.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    p.add_argument("--model", default=None)
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--intents", type=int, default=12)
    p.add_argument("--taught", type=int, default=10)
    p.add_argument("--asked", type=int, default=20, help="asked rows per intent")
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--both", action="store_true", help="decode the hold-off answer for every row")
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=Path("bench-results/hold"))
    c = sub.add_parser("choose", help="the rule over probe files")
    c.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "probe":
        probe(args)
    else:
        choose(args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
