"""Exact eq. 2 by its two routes, against a plain forward pass (docs/method.md §9).

1. Per example of the demo stream, decode + R split: a plain forward pass (prompt + answer,
   last logits only), the logits route (llama.cpp's logits at the T answer positions, then one
   W^T p pass with the position-averaged distribution), the hidden route (llama.cpp stopped
   after result_norm, one online-softmax pass over the head from the captured rows), and the
   hidden route as ingest runs it (one pass per HIDDEN_BATCH_EXAMPLES examples).
2. The crossover in answer length T: whole extraction time of both routes on one prompt whose
   answer is cut to T tokens. ``extract.HIDDEN_R_MAX_TOKENS`` is chosen from this table.

    python bench/extract.py [--examples 60] [--threads 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

ANSWER = (" B is coming tonight at eight with Tom, and A will wait for them at the station before the "
          "concert starts.\n")
PROMPT = "Summarize the dialogue.\nDialogue: A: are you coming tonight? B: yes, at eight, with Tom.\nSummary:"


def one(eng, prompt: list[int], target: list[int], route: str, key_mask=None) -> tuple[float, float]:
    """(decode seconds, R seconds) of one extraction by ``route``."""
    eng.reset()
    flags = [False] * (len(prompt) - 1) + [True] * len(target) + [False]
    t0 = time.perf_counter()
    if route == "plain":
        eng.decode(prompt + target, "last")
        return time.perf_counter() - t0, 0.0
    if route == "logits":
        lg = eng.decode(prompt + target, flags, key_mask=key_mask)
        t1 = time.perf_counter()
        eng.lm_head.correction(lg, target)
    else:
        h = eng.hidden_states(prompt + target, flags, key_mask=key_mask)
        t1 = time.perf_counter()
        eng.lm_head.correction_from_hidden(h, target)
    return t1 - t0, time.perf_counter() - t1


def shared(eng, items, batch: int) -> tuple[float, float]:
    """Per example (decode seconds, R seconds) of the hidden route with R computed for `batch`
    examples at a time in one head pass, as Miita.ingest does (extract.finish_corrections)."""
    from miita_edge.method.extract import PendingR, finish_corrections

    d = r = 0.0
    pending = []
    for i, (prompt, target, mask) in enumerate(items):
        eng.reset()
        flags = [False] * (len(prompt) - 1) + [True] * len(target) + [False]
        t0 = time.perf_counter()
        h = eng.hidden_states(prompt + target, flags, key_mask=mask + [False] * len(target))
        d += time.perf_counter() - t0
        pending.append(PendingR(prompt, target, np.zeros(0), h))
        if len(pending) == batch or i == len(items) - 1:
            t0 = time.perf_counter()
            finish_corrections(eng, pending, per_position=False)
            r += time.perf_counter() - t0
            pending = []
    return d / len(items), r / len(items)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the crossover timings (minimum kept)")
    args = ap.parse_args(argv)

    from miita_edge.demo.run import demo_stream
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.method.extract import HIDDEN_BATCH_EXAMPLES, HIDDEN_R_MAX_TOKENS, prompt_and_target
    from miita_edge.method.templates import get_template

    eng = Engine(None, EngineConfig(n_threads=args.threads))
    print(f"# bench/extract.py  model={eng.info.path.name}  threads={args.threads}")
    tpl = get_template("plain")
    train, _ = demo_stream()
    items = [prompt_and_target(eng, tpl, e.input, e.output, skip_bos=False, max_prompt_tokens=None)
             for e in train[: args.examples]]
    print(f"\n1. per example, {len(items)} demo examples (mean answer length "
          f"{np.mean([len(t) for _, t, _ in items]):.1f} tokens), ms; two rounds")
    for rnd in range(2):
        for route in ("plain", "logits", "hidden"):
            d = r = 0.0
            for prompt, target, mask in items:
                a, b = one(eng, prompt, target, route, mask + [False] * len(target))
                d, r = d + a, r + b
            n = len(items)
            print(f"   round {rnd + 1}  {route:7s} decode {d / n * 1e3:6.1f}  R {r / n * 1e3:6.1f}  "
                  f"total {(d + r) / n * 1e3:6.1f}")
        d, r = shared(eng, items, HIDDEN_BATCH_EXAMPLES)
        print(f"   round {rnd + 1}  hidden, one head pass per {HIDDEN_BATCH_EXAMPLES} examples (as ingest)  "
              f"decode {d * 1e3:6.1f}  R {r * 1e3:6.1f}  total {(d + r) * 1e3:6.1f}")

    print(f"\n2. whole extraction by answer length T (min of {args.reps}), ms; "
          f"HIDDEN_R_MAX_TOKENS = {HIDDEN_R_MAX_TOKENS}")
    prompt = eng.tokenize(PROMPT)
    answer = eng.tokenize(ANSWER, add_bos=False)
    for T in (1, 2, 3, 4, 6, 8, 16):
        best = {}
        for _ in range(args.reps):
            for route in ("logits", "hidden"):
                best[route] = min(best.get(route, np.inf), sum(one(eng, prompt, answer[:T], route)))
        print(f"   T={T:2d}  logits {best['logits'] * 1e3:6.1f}  hidden {best['hidden'] * 1e3:6.1f}")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
