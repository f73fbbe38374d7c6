"""The most a correction of the answer's *form* could give on an open-ended benchmark (dev rows).

docs/results/open_ended/README.md found what the frozen models get wrong on XQuAD: they restate the
question, pick the wrong span, and run past the span. A task-level correction in MIITA's frame is an
addition to the final hidden state, i.e. a change of the logits along the LM head; the form it could
carry, learned from a memory of extractive answers, is "copy from the prompt, a contiguous span, then
stop". This script gives each such form to the logits *directly*, at its ideal strength, so that its
score is the most that a correction favouring these tokens, and changing nothing else among them,
can reach (a hidden-space addition can only approach a hard restriction):

    frozen         the model alone (greedy; the answer ends at its first newline after text)
    bag:B          every token of the prompt raised by B logits at every step
    span:B         step 0: every prompt token raised by B; step s > 0: the tokens that continue the
                   longest suffix of the answer so far somewhere in the prompt, and the newline
    context:B      as span, over the context paragraph only, and the first token is none of the
                   question's tokens (no restatement)
    ...+len        the answer stops at its best token: the best score over every prefix of the
                   answer's tokens, an oracle stop that no memory has, so the bound includes a
                   perfect length

B is a number of logits, or ``inf`` (only the set's tokens may be produced). Nothing here reads a test
row: the rows are ``load_benchmark(..., split="dev")``'s, the ones the dev runs score.

    python bench/form_ceiling.py --benchmark xquad --data ../shared/data [--model GGUF] --out FILE.json
    python bench/form_ceiling.py --from FILE.json [--against RUN/result.json ...]

``--from`` prints the table again from an archived output; ``--against`` adds, per variant, the
paired difference (a harness run on the same dev rows, e.g. ``example-mem``, minus the variant) with
its 95% bootstrap interval over queries (``bench/paired_diff.py``'s).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

VARIANTS = ("frozen", "frozen+len", "bag:4", "bag:inf", "span:4", "span:inf", "span:inf+len", "context:4",
            "context:inf", "context:inf+len")
_VARIANT = re.compile(r"(frozen|bag|span|context)(?::(inf|\d+(?:\.\d+)?))?(\+len)?")


def parse_variant(text: str) -> tuple[str, float, bool]:
    """(kind, bias in logits, oracle stop) of one variant name; a one-line error for a bad one."""
    m = _VARIANT.fullmatch(text.strip())
    if m is None or (m.group(1) == "frozen") != (m.group(2) is None):
        raise SystemExit(f"form_ceiling: bad variant {text!r} (frozen[+len], or KIND:B[+len] with KIND in "
                         "bag, span, context and B a number or inf)")
    return m.group(1), (math.inf if m.group(2) == "inf" else float(m.group(2) or 0.0)), bool(m.group(3))


def continuations(source: list[int], answer: list[int]) -> set[int]:
    """The tokens that follow the longest suffix of ``answer`` found in ``source`` (every place it
    occurs); all of ``source`` for an empty answer; empty when not even its last token occurs."""
    if not answer:
        return set(source)
    for n in range(min(len(answer), len(source) - 1), 0, -1):
        suffix = answer[-n:]
        nxt = {source[i + n] for i in range(len(source) - n) if source[i:i + n] == suffix}
        if nxt:
            return nxt
    return set()


def favoured(kind: str, prompt: list[int], context: list[int], question: set[int], answer: list[int],
             stop: set[int]) -> set[int]:
    """The tokens a variant raises at this step (empty: none)."""
    if kind == "frozen":
        return set()
    if kind == "bag":
        return set(prompt) | (stop if answer else set())
    src = prompt if kind == "span" else context
    chosen = continuations(src, answer)
    if kind == "context" and not answer:
        chosen -= question
    return chosen | stop if answer and chosen else chosen


def biased(logits: np.ndarray, tokens: set[int], bias: float) -> np.ndarray:
    """The logits with ``tokens`` raised by ``bias`` (restricted to them where it is inf)."""
    z = np.array(logits, np.float64)
    if not tokens:
        return z
    ids = np.fromiter(sorted(tokens), np.int64)
    if math.isinf(bias):
        keep = z[ids]
        z[:] = -np.inf
        z[ids] = keep
    else:
        z[ids] += bias
    return z


def split_qa(x: str) -> tuple[str, str]:
    """(context paragraph, question) of an XQuAD input "Context: ...\\nQuestion: ..."; for other
    inputs (SuperNI) the whole input is the context and there is no question."""
    ctx, sep, q = x.partition("\nQuestion:")
    return ctx.removeprefix("Context:").strip(), q.strip() if sep else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", default="xquad", choices=("xquad", "superni"))
    ap.add_argument("--data", help="the benchmarks' parent directory (shared/data)")
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled Gemma-3-270M)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", help="JSON file for every row's answers and scores")
    ap.add_argument("--from", dest="from_", type=Path, help="an archived output: print its table, run nothing")
    ap.add_argument("--against", type=Path, nargs="*", default=[],
                    help="harness results (result.json) on the same dev rows to pair each variant with")
    args = ap.parse_args(argv)
    if args.from_ is not None:
        return report(json.loads(args.from_.read_text("utf-8")), args.against)
    if not args.out or not args.data:
        ap.error("--data and --out are required (or --from FILE to print an archived table)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    parsed = {v: parse_variant(v) for v in variants}

    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.metrics import exact_match, rouge_l
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine
    from miita_edge.runtime.engine_types import EngineConfig

    spec = get_benchmark(args.benchmark)
    _, stages = load_benchmark(spec, Path(args.data) / spec.data_name, split="dev")
    tpl = get_template(spec.template)
    eng = Engine(args.model, EngineConfig(n_threads=args.threads))
    stop = set(eng.tokenize("\n", add_bos=False))
    rows: list[dict] = []
    t0 = time.time()
    for st in stages:
        for it in st.test:
            x = it.example.input
            prompt = prompt_tokens(eng, tpl, x, spec.max_prompt_tokens)
            source = [t for t in prompt if t != eng.bos]
            ctx_text, q_text = split_qa(x)
            context = eng.tokenize(" " + ctx_text, add_bos=False)
            question = set(eng.tokenize(" " + q_text, add_bos=False)) | set(eng.tokenize(q_text, add_bos=False))
            state = eng.query(prompt)
            row = {"stage": st.name, "gold": it.golds[0], "answers": {}, "scores": {}}
            for v, (kind, bias, oracle) in parsed.items():
                eng.truncate(len(prompt))
                logits, answer = state.logits, []
                for _ in range(spec.max_tokens):
                    tok = int(np.argmax(biased(logits, favoured(kind, source, context, question, answer, stop),
                                               bias)))
                    if eng.is_eog(tok):
                        break
                    answer.append(tok)
                    text = eng.detokenize(answer)
                    if (text.strip() and "\n" in text.lstrip()):
                        break
                    logits = eng.decode([tok], "last")[0]
                text = eng.detokenize(answer)

                def scored(t: str) -> float:
                    return float(exact_match(t, it.golds, it.lang or "en") if spec.metric == "exact_match"
                                 else rouge_l(t, it.golds))

                cuts = [eng.detokenize(answer[:n]) for n in range(len(answer) + 1)] if oracle else [text]
                scores = [scored(t) for t in cuts]
                best = int(np.argmax(scores))  # the first best prefix, as max() chose it
                text, score = cuts[best], scores[best]
                row["answers"][v], row["scores"][v] = text.strip(), float(score)
            rows.append(row)
        done = {v: 100 * float(np.mean([r["scores"][v] for r in rows])) for v in variants}
        print(f"after {st.name} ({len(rows)} rows, {time.time() - t0:.0f} s): "
              + ", ".join(f"{v} {s:.1f}" for v, s in done.items()), file=sys.stderr, flush=True)
    summary = {v: round(100 * float(np.mean([r["scores"][v] for r in rows])), 1) for v in variants}
    by_stage = {st.name: {v: round(100 * float(np.mean([r["scores"][v] for r in rows if r["stage"] == st.name])), 1)
                          for v in variants} for st in stages}
    out = {"benchmark": args.benchmark, "model": Path(args.model).name if args.model else "bundled", "split": "dev",
           "metric": spec.metric, "rows": len(rows), "variants": variants, "summary": summary, "by_stage": by_stage,
           "per_row": rows}
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1))
    return report(out, args.against)


def report(out: dict, against: list[Path]) -> int:
    """The table of one output: each variant's score per stage and overall, and its paired difference
    to each harness run of ``against`` (same rows, same order: checked by count)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from paired_diff import final_row, paired_interval

    variants = out.get("variants") or list(out["summary"])
    stages = list(out["by_stage"])
    print(f"{out['benchmark']} dev rows: {out['rows']} ({out['model']}), metric {out.get('metric', '')} x100")
    runs = []
    for path in against:
        res, scores = final_row(path)
        if scores.size != out["rows"]:
            raise SystemExit(f"{path}: {scores.size} scored rows, this output has {out['rows']}")
        runs.append((f"{res['method']} ({res['budget_spec']})", scores))
    head = "| variant | " + " | ".join(stages) + " | all |" + "".join(f" {name} − variant [95%] |" for name, _ in runs)
    print(head)
    print("|---|" + "---:|" * (len(stages) + 1) + "---|" * len(runs))
    for v in variants:
        mine = np.array([r["scores"][v] for r in out["per_row"]], float)
        cells = "".join(" {:+.1f} [{:+.1f}, {:+.1f}] |".format(*paired_interval(mine, s, 10_000)) for _, s in runs)
        print(f"| {v} | " + " | ".join(f"{out['by_stage'][st][v]:.1f}" for st in stages)
              + f" | {out['summary'][v]:.1f} |" + cells)
    for name, s in runs:
        print(f"{name}: {100 * s.mean():.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
