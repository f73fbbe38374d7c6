"""What adaptation costs per generated token: the default preset's answer time against the frozen
model's, in one run, for a memory of labels and a memory of replies.

Each memory is stage 1 of Banking77 (its training rows outside the dev rows, no budget), taught
with the intent labels or with the package's canned replies; its questions are that stage's dev
rows (in-domain, so the memory steers). Each question is asked with the memory and without it in
alternating order (A/B, then B/A), greedy, and each side's time is divided by the tokens it
generated: the ratio compares cost per token, so a steered reply that is longer than the frozen
one is not counted as slower for being longer. The first question of each memory is asked once
before timing (the head geometry, the generic questions' keys and the retrieval index are derived
then, once per memory).

A steered answer's draft (the memory's stored answer, verified in one batched decode) is on as in
the product; ``--no-draft`` decodes one step at a time instead (EngineConfig.draft), to compare.

    python bench/latency.py [--model GGUF] [--threads 2] [--rows 200] [--questions 30] [--no-draft]
                            [--target NAME=LIMIT] [--parts]

``--parts``: also the default's answer time split by part (the prompt pass, the model's reading of the
leading answers, generation), from a profile of the timed steered answers (the profiler's own cost is
in the figures; they are for comparing the parts, the ratios above are for the target).
"""
from __future__ import annotations

import argparse
import sys
from contextlib import closing
import tempfile
import time
from pathlib import Path

from _report import ROOT, Target, parse_with_targets, preset_for

DATA = ROOT.parent / "shared" / "data" / "banking77"


def timed(m, q: str, adapt: bool, max_tokens: int) -> tuple[float, int, bool]:
    """(seconds, generated tokens, steered) of one answer."""
    seen = []
    t0 = time.perf_counter()
    a = m.ask(q, max_tokens=max_tokens, adapt=adapt, on_token=seen.append)
    return time.perf_counter() - t0, max(len(seen), 1), a.adapted


PARTS = {"prompt pass": "query", "reading the leading answers": "_read_answers", "generation": "generate",
         "retrieval and plan, reading included": "plan_query"}


def parts(m, questions: list[str], max_tokens: int) -> str:
    """ms per steered answer spent in each of PARTS (cumulative time of the function named)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for q in questions:
        m.ask(q, max_tokens=max_tokens)
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = []
    for label, name in PARTS.items():
        ct = sum(v[3] for k, v in stats.items() if k[2] == name)
        out.append(f"{label} {1000 * ct / len(questions):.0f}")
    return "; ".join(out) + " ms per answer"


def measure(m, questions: list[str], max_tokens: int) -> dict:
    timed(m, questions[0], True, max_tokens)  # derives the memory's caches once
    on = {"s": 0.0, "tok": 0}
    off = {"s": 0.0, "tok": 0}
    steered = 0
    for i, q in enumerate(questions):
        order = (True, False) if i % 2 == 0 else (False, True)
        for adapt in order:
            s, n, adapted = timed(m, q, adapt, max_tokens)
            side = on if adapt else off
            side["s"] += s
            side["tok"] += n
            steered += adapt and adapted
    return {"on_ms": 1000 * on["s"] / on["tok"], "off_ms": 1000 * off["s"] / off["tok"],
            "on_tok": on["tok"], "off_tok": off["tok"], "steered": steered, "n": len(questions)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=200, help="training rows of stage 1 taught")
    ap.add_argument("--questions", type=int, default=30, help="dev rows of stage 1 asked")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--no-draft", action="store_true", help="decode each steered step alone (no draft batches)")
    ap.add_argument("--parts", action="store_true", help="also split the default's answer time by part")
    ap.add_argument("--with", dest="candidate", metavar="CANDIDATE", help="the default with a candidate mechanism "
                    "switched on (evaluation/ablation.py CANDIDATES), to time it against the same frozen model")
    ap.add_argument("--version", type=int, metavar="N", help="an earlier version of the default "
                    "(presets.preset_version), to time today's against it on the same machine")
    wanted = [Target("labels", "<=", 1.10, "x", "ms per generated token, default / frozen, memory of labels"),
              Target("replies", "<=", 1.10, "x", "ms per generated token, default / frozen, memory of replies")]
    args, targets = parse_with_targets(ap, wanted)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge import Miita
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.runtime.engine import Engine, EngineConfig

    preset = preset_for("latency.py", args.candidate, args.version)
    if args.candidate:
        print(f"the default with {args.candidate}", flush=True)
    if args.version is not None:
        print(f"the default as version {args.version}", flush=True)
    with closing(Engine(args.model, EngineConfig(n_threads=args.threads, stop_after_text=True,
                                                    draft=not args.no_draft))) as engine:
        for kind, bench in (("labels", "banking77"), ("replies", "banking77-replies")):
            spec = get_benchmark(bench)
            _, stages = load_benchmark(spec, args.data, stages="1", split="dev")
            rows = stages[0].train[:args.rows]
            questions = [t.example.input for t in stages[0].test[:args.questions]]
            with tempfile.TemporaryDirectory() as tmp:
                m = Miita(memory=Path(tmp) / "mem", template=spec.template, engine=engine, preset=preset)
                m.ingest(rows, budget="none", progress=False)
                r = measure(m, questions, args.max_tokens)
                split = parts(m, questions, args.max_tokens) if args.parts else None
                m.close()
            ratio = r["on_ms"] / r["off_ms"]
            per_q = (r["on_ms"] * r["on_tok"]) / (r["off_ms"] * r["off_tok"])
            print(f"{kind:8s} draft {'off' if args.no_draft else 'on '}, {len(rows)} rows taught, {r['n']} questions ({r['steered']} steered): "
                  f"default {r['on_ms']:.1f} ms/token ({r['on_tok']} tokens), frozen {r['off_ms']:.1f} ms/token "
                  f"({r['off_tok']} tokens): {ratio:.2f}x  {targets.check(kind, ratio)}; per answer "
                  f"{r['on_ms'] * r['on_tok'] / r['n']:.0f} vs {r['off_ms'] * r['off_tok'] / r['n']:.0f} ms "
                  f"({per_q:.2f}x)",
                  flush=True)
            if split:
                print(f"{kind:8s} parts: {split}", flush=True)
    print(targets.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
