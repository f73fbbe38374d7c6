"""What the frozen model gets wrong on an open-ended benchmark's dev rows, by kind of error.

A correction can only carry what the frozen answer lacks. This sorts each frozen answer (from the
baseline cache ``miita-edge bench --method frozen --split dev --baseline-cache DIR`` wrote; the same
cache every dev run of that model and benchmark shares) against its gold answers into one kind:

    right      the benchmark's own score is full (exact match for XQuAD, ROUGE-L = 1 for SuperNI)
    overlong   a gold answer is inside the answer, with more words around it: the span was found,
               the answer did not stop at it
    partial    shares words with a gold answer (token F1 > 0) without containing one
    copied     shares no word with a gold answer, and the answer (its first line) is a span of the
               prompt: it copies, but another span
    unrelated  none of the above
    empty      nothing but whitespace

and reports, per benchmark stage and overall: the benchmark's mean score, the kinds' shares, the answer's length against the
gold's (median word ratio), whether its first word is the gold's, and how many answers open with
a restatement ("The ...", "Answer:", the question's own first words). Nothing here reads a test
row: the dev rows come from ``load_benchmark(..., split="dev")``, as the dev runs' do.

    python bench/frozen_errors.py --benchmark xquad --data ../shared/data --baseline-cache DIR [--show 5]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = 1.0 - 1e-9  # a full score, up to rounding
KINDS = ("right", "overlong", "partial", "copied", "unrelated", "empty")
_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def token_f1(pred: str, gold: str) -> float:
    p, g = words(pred), words(gold)
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g or not common:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def squash(text: str) -> str:
    return " ".join(words(text))


def kind_of(pred: str, golds: list[str], prompt: str, full: bool) -> str:
    """One kind per answer, in the order of the module docstring (the first that applies)."""
    if not pred.strip():
        return "empty"
    if full:
        return "right"
    p = squash(pred)
    if any(squash(g) and f" {squash(g)} " in f" {p} " for g in golds):
        return "overlong"
    if max(token_f1(pred, g) for g in golds) > 0:
        return "partial"
    first_line = next((ln for ln in pred.strip().splitlines() if ln.strip()), "")
    if squash(first_line) and f" {squash(first_line)} " in f" {squash(prompt)} ":
        return "copied"
    return "unrelated"


def restates(pred: str, question: str) -> bool:
    """Opens like a sentence about the question rather than with the answer itself."""
    w = words(pred)
    q = words(question)
    return bool(w) and (w[0] in ("the", "answer", "a", "an", "it", "in", "this") or (len(q) >= 2 and w[:2] == q[:2]))


def question_of(prompt: str) -> str:
    """The last line of the prompt that carries text (XQuAD: "Question: ..."; SuperNI: "Output:")."""
    lines = [ln for ln in prompt.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last.split(":", 1)[1] if last.startswith("Question:") else last


def analyse(rows: list[tuple[str, str, list[str], str, float]]) -> dict:
    """rows: (stage, prediction, golds, prompt, the benchmark's score in 0..1) -> what the report prints."""
    kinds = Counter()
    ratios, first_word, restate = [], 0, 0
    for _, pred, golds, prompt, score in rows:
        kinds[kind_of(pred, golds, prompt, score >= FULL)] += 1
        g = min(golds, key=lambda s: len(words(s))) if golds else ""
        if words(g):
            ratios.append(len(words(pred)) / len(words(g)))
            first_word += bool(words(pred)) and words(pred)[0] == words(g)[0]
        restate += restates(pred, question_of(prompt))
    return {"n": len(rows), "kinds": kinds, "score": 100 * statistics.fmean(r[4] for r in rows) if rows else 0.0, "ratio": statistics.median(ratios) if ratios else float("nan"),
            "first_word": first_word, "restate": restate}


def load_rows(benchmark: str, data: Path, cache: Path) -> list[tuple[str, str, list[str], str, float]]:
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.run_cells import per_example

    spec = get_benchmark(benchmark)
    _, stages = load_benchmark(spec, data / spec.data_name, split="dev")
    by_stage = {}
    for f in sorted(cache.glob("frozen-*.json")):
        d = json.loads(f.read_text("utf-8"))
        by_stage[d["stage"]] = d["predictions"]
    rows = []
    for st in stages:
        preds = by_stage.get(st.name)
        if preds is None:
            raise SystemExit(f"{cache}: no frozen predictions for stage {st.name!r} (run the frozen dev baseline first)")
        if len(preds) != len(st.test):
            raise SystemExit(f"{cache}: stage {st.name!r} has {len(preds)} predictions for {len(st.test)} dev rows")
        scores = per_example(spec, preds, st.test)
        for pred, item, s in zip(preds, st.test, scores):
            rows.append((st.name, pred, item.golds, item.example.input, float(s)))
    return rows


def report(rows, show: int) -> list[str]:
    out = []

    def line(name: str, a: dict) -> str:
        n = a["n"]
        shares = "  ".join(f"{k} {100 * a['kinds'][k] / n:5.1f}" for k in KINDS)
        return (f"{name[:28]:<28} n={n:4d}  score {a['score']:5.1f}  {shares}  | length ×{a['ratio']:.1f} of gold (median), first word "
                f"{100 * a['first_word'] / n:.1f}%, restates {100 * a['restate'] / n:.1f}%")

    for st in dict.fromkeys(r[0] for r in rows):
        out.append(line(st, analyse([r for r in rows if r[0] == st])))
    out.append(line("all", analyse(rows)))
    shown = Counter()
    for st, pred, golds, prompt, score in rows:
        k = kind_of(pred, golds, prompt, score >= FULL)
        if k != "right" and shown[k] < show:
            shown[k] += 1
            out.append(f"  {k:<9} {st}: {pred.strip()[:90]!r}  gold {golds[0][:60]!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmark", required=True, choices=("xquad", "superni"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--baseline-cache", type=Path, required=True, help="the dev runs' --baseline-cache directory")
    ap.add_argument("--show", type=int, default=4, help="examples printed per kind")
    args = ap.parse_args(argv)
    print(f"# command: python bench/frozen_errors.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("\n".join(report(load_rows(args.benchmark, args.data, args.baseline_cache), args.show)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
